# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An HTTP request from a host, answered as ansible.builtin.uri reports it (for the modules that ask a source from
the host: apt_trial, venv_facts): ``status`` (-1 without an answer), ``msg`` ("Status code was 404 and not [200]:
HTTP Error 404: Not Found", as uri words a status other than 200), ``url`` (after redirects), and with
``content`` the body."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.urls import fetch_url


def http_answer(module, url, method="GET", timeout=15, content=False):
    response, info = fetch_url(module, url, method=method, timeout=timeout)
    status = info.get("status", -1)
    answer = {"item": url, "status": status, "url": info.get("url", url), "msg": info.get("msg", "")}
    if status != 200:
        answer["msg"] = "Status code was {0} and not [200]: {1}".format(status, info.get("msg", ""))
    if response is not None:
        if content:
            answer["content"] = to_text(response.read(), errors="surrogate_or_strict")
        response.close()
    elif content:
        answer["content"] = to_text(info.get("body", b""), errors="surrogate_or_strict")
    return answer
