"""gpufleet's judgement of an NVIDIA driver that gpufleet did not install (a "foreign" driver), on the controller.
 The filter ``gpufleet.fleet.foreign_driver`` and the parsers it reads the probe's commands with (``dpkg_list``,
``apt_policy_installed``, ``apt_policy_files``, ``dpkg_owners``), each documented in its YAML file beside this one
(plugins/filter/<name>.yml), which ``ansible-doc -t filter gpufleet.fleet.<name>`` prints. The judgement is
plugins/module_utils/driver_facts.py's, which the module gpufleet.fleet.driver_facts runs on the host (the role's
read, tasks/foreign.yml); the filter is that judgement for the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.fleet.plugins.module_utils import driver_facts
from ansible_collections.gpufleet.fleet.plugins.module_utils.driver_facts import (
    apt_policy_files,
    apt_policy_installed,
    dpkg_list,
    dpkg_owners,
)


def foreign_driver(
    sections: Any,
    layouts: Mapping[str, Any],
    source: str,
    branch: Any,
    repository_url: str = "",
    fact: Mapping[str, Any] | None = None,
    mode: str = "refuse",
    host: str = "",
) -> dict[str, Any]:
    """The judgement of what the probe found (foreign_driver.yml)."""
    try:
        return driver_facts.foreign_driver(sections, layouts, source, branch, repository_url, fact, mode, host)
    except ValueError as error:
        raise AnsibleFilterError(str(error)) from error


class FilterModule:
    def filters(self) -> dict[str, Any]:
        # Each filter is named as its function.
        return {
            function.__name__: function
            for function in (foreign_driver, dpkg_list, dpkg_owners, apt_policy_installed, apt_policy_files)
        }
