"""The test plugins (plugins/test/): fetch_failure and http_url, called directly."""

from __future__ import annotations

import pytest
from plugin_files import tests_plugin

# --- fetch_failure -----------------------------------------------------------


@pytest.mark.parametrize(
    "result",
    [
        {"failed": True, "msg": "Failed to fetch http://mirror/debian/dists/bookworm/InRelease"},
        {"failed": True, "stderr": "curl: (7) Failed to connect to mirror port 80: Connection refused"},
        {"failed": True, "msg": "Temporary failure resolving 'mirror.gpufleet.lab'"},
        {"failed": True, "msg": "Request failed: <urlopen error timed out>"},
        {
            "failed": True,
            "msg": "Status code was -1: Request failed: <urlopen error [Errno -2] Name or service not known>",
        },
        {
            "failed": True,
            "stderr": (
                "ERROR: Could not install packages due to an OSError: HTTPConnectionPool(host='mirror', port=80): Max "
                "retries exceeded (Caused by NewConnectionError: Failed to establish a new connection: [Errno 111] "
                "Connection refused)"
            ),
        },
        {
            "failed": True,
            "msg": "One or more items failed",
            "results": [{"msg": "ok"}, {"msg": "Could not fetch index"}],
        },
    ],
)
def test_fetch_failure_holds_for_a_source_that_did_not_answer(result):
    assert tests_plugin.fetch_failure(result)


@pytest.mark.parametrize(
    "result",
    [
        {"failed": False, "msg": "Failed to fetch (but the task succeeded)"},
        {"failed": True, "msg": "No package matching 'nvidia-driver-999' is available"},
        {"failed": True, "stderr": "E: Unable to correct problems, you have held broken packages."},
        # A template error is not a source that did not answer.
        {
            "failed": True,
            "msg": "Task failed: Finalization of task args for 'ansible.builtin.set_fact' failed: "
            "Error while resolving value for 'pytorch_report': 'NoneType' object has no attribute 'group'",
        },
        {},
        None,
        "Failed to fetch",
    ],
)
def test_fetch_failure_does_not_hold_for_other_failures_or_successes(result):
    assert not tests_plugin.fetch_failure(result)


@pytest.mark.parametrize(
    "url", ["http://mirror/debian", "https://apt.corp.example:8443/nvidia/cuda/", "http://10.0.0.5"]
)
def test_http_url_accepts_http_urls(url):
    assert tests_plugin.http_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "",
        "mirror/debian",
        "ftp://mirror/debian",
        "http://",
        "http://mirror/a b",
        "http://mirror/{variant}",
        "https://mirror/$(id)x{",
        42,
        None,
    ],
)
def test_http_url_rejects_anything_else(url):
    assert not tests_plugin.http_url(url)
