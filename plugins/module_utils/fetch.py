# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a failure's words say that a source did not answer: one place for the phrases.

The module gpufleet.fleet.host_facts retries apt on them (this file is shipped with
the module, so it keeps to Python 3.8 and the standard library) and the test plugin
gpufleet.fleet.fetch_failure judges a registered result by them.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# Phrases of apt, get_url, uri, pip and curl when a source does not answer.
# Whole phrases, not stems: "Error while resolving value for ..." (a template
# error) must not pass for a name that did not resolve.
FETCH_FAILURE = re.compile(
    r"(?i)(failed|unable) to fetch|could not fetch|fetch failed"
    r"|(failed|unable) to connect|(could not|cannot) connect|connection (refused|reset|timed out|aborted)"
    r"|temporary failure (in name )?resolv|could not resolve|name or service not known|name resolution"
    r"|no route to host|network is unreachable|timed out|refused"
)


def fetch_failure(text):
    """True when apt's, pip's or curl's words say that a source did not answer."""
    return FETCH_FAILURE.search(text or "") is not None
