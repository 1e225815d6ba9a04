"""The lab network's addresses (tests/lab/vars/lab.yml): every address podman may lease to a container started
without one is a host address of the subnet.

podman 4.3 leases an ip_range up to its last address: with 10.89.77.240/28 that was 10.89.77.255, the /24's
broadcast address, and a container given it reached no one: on the lab network on 2026-12-05, a container with
--ip 10.89.77.255 timed out connecting to the mirror (python3 socket.create_connection, 8 s) where one with
10.89.77.246 connected, and a training image build whose pip step was leased it failed in 2 of 4 rehearsals.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import yaml

LAB_VARS = yaml.safe_load((Path(__file__).resolve().parents[2] / "tests" / "lab" / "vars" / "lab.yml").read_text())


def _lease_range(ip_range: str) -> list[ipaddress.IPv4Address]:
    """What podman 4.3 leases from an ip_range: its addresses after the first, up to and including its last (seen:
    10.89.77.240/28 gave 10.89.77.241-10.89.77.255, 10.89.77.240/29 gives 10.89.77.241-10.89.77.247)."""
    return list(ipaddress.ip_network(ip_range))[1:]


def test_no_container_is_leased_the_subnet_s_network_or_broadcast_address():
    subnet = ipaddress.ip_network(LAB_VARS["lab_subnet"])
    leased = _lease_range(LAB_VARS["lab_dynamic_range"])
    assert leased and all(address in subnet for address in leased)
    assert subnet.broadcast_address not in leased and subnet.network_address not in leased
    # The old range had it: the check sees the defect it guards against.
    assert subnet.broadcast_address in _lease_range("10.89.77.240/28")


def test_the_leased_addresses_are_none_of_the_fixed_ones():
    """The fixed addresses (the mirror, the head node, the nodes, molecule's, the tests' extra nodes up to .239) are
    below the range."""
    prefix = LAB_VARS["lab_address_prefix"]
    leased = _lease_range(LAB_VARS["lab_dynamic_range"])
    assert min(leased) > ipaddress.ip_address(prefix + "239")
    assert ipaddress.ip_address(prefix + str(LAB_VARS["lab_mirror_host_number"])) not in leased
