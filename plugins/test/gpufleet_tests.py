"""gpufleet's Jinja tests: the rules several roles share, in one place.

Each test's manual is its YAML file beside this one (plugins/test/<name>.yml), which
``ansible-doc -t test gpufleet.fleet.<name>`` prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible_collections.gpufleet.fleet.plugins.module_utils import fetch
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import is_http_url


def failure_text(result: Any) -> str:
    """The messages of a registered result (msg, stderr, the items' msg of a loop)."""
    if not isinstance(result, Mapping):
        return ""
    parts = [str(result.get("msg") or ""), str(result.get("stderr") or "")]
    for item in result.get("results") or []:
        if isinstance(item, Mapping):
            parts.append(failure_text(item))
    return " ".join(part for part in parts if part)


def fetch_failure(result: Any) -> bool:
    """True when ``result`` failed and its messages say that a source did not answer."""
    if not isinstance(result, Mapping) or not result.get("failed"):
        return False
    return fetch.fetch_failure(failure_text(result))


def http_url(value: Any) -> bool:
    """True for an http(s) URL with a host (``http://mirror:8080/debian``): the roles' rules' own test."""
    return is_http_url(value)


class TestModule:
    """gpufleet.fleet tests."""

    def tests(self) -> dict[str, Any]:
        return {"fetch_failure": fetch_failure, "http_url": http_url}
