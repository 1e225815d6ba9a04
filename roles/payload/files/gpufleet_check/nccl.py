"""What NCCL's own log says it used between nodes, and the judgement of the smoke training's network figures.

The launcher (``gpufleet_check train``) runs the payload with ``NCCL_DEBUG=INFO``,
``NCCL_DEBUG_SUBSYS=INIT,NET`` and ``NCCL_DEBUG_FILE=<run dir>/nccl-%h-%p.log`` (NCCL's
own ``%h`` host, ``%p`` pid: one file per rank; NVIDIA's NCCL documentation, "Logging",
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/logging.html),
then ``read_logs`` reads that node's files. The lines it reads (NCCL's src/transport/net.cc,
net_ib.cc, init.cc; each INFO in the INIT or NET subsystem, so the two suffice)::

    NCCL INFO Using network IB                                         the network NCCL chose
    NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>
                                                                       its HCAs, port, link layer
    NCCL INFO NET/Socket : Using [0]eno2:10.42.0.2<0>                  socket interfaces
    NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
                                                                       a connection between nodes
    NCCL INFO Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA   (before 2.12)
    NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'     no GPUDirect RDMA on that HCA
    NCCL INFO NET/IB : GPU Direct RDMA (DMABUF) enabled for HCA 0 'mlx5_0'
    NCCL WARN ...                                                      kept as warnings

Only text after "NCCL INFO"/"NCCL WARN" (or "INFO", or the line, when a tool cut the prefix) is read;
the host:pid:tid [dev] prefix, an mpirun "[0] " tag and timestamps are ignored.

``summarize`` says, for a node (all its ranks' lines):

``transport``  between nodes: ``IB`` (NCCL's verbs transport over an InfiniBand link), ``RoCE``
               (the same over Ethernet: the HCAs' ``/RoCE``), ``IB/RoCE`` (verbs, the link layer
               not in the log), ``Socket`` (TCP through the host), or a plugin's own network name
               (``AWS Libfabric``). The network of the NET connections ("via NET/<name>/<dev>")
               when there are any, else the one NCCL chose ("Using network <name>"), else what the
               HCA lines imply; None without any of them. A "NET/Socket : Using" line alone is not
               a socket transport: NCCL before 2.6 printed it beside NET/IB for its bootstrap.
``gdr``        GPUDirect RDMA: ``on`` (every NET connection ``/GDRDMA``), ``off`` (none; or, without
               connections, every HCA line "Disabled"; always on Socket), ``partial`` (some), None
               (not in the log). ``gdr_basis`` says which lines decided it.
``crossed``    whether any connection went through the network (NET), i.e. between nodes.

``judge`` (used on the controller by the smoke_training role, through the filter
``gpufleet.fleet.smoke_network``) sets the payload's measured figures (train.py's ``network``)
and every node's reading against the bus-bandwidth floors and the inventory's expectations.
Standard library only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

LOG_GLOB = "nccl-*.log"
LOG_NAME = "nccl-%h-%p.log"  # NCCL_DEBUG_FILE: NCCL puts the host for %h and the pid for %p
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
MAX_EVIDENCE, MAX_WARNINGS = 8, 5

_BODY = re.compile(r"(?:^|\s)(?:NCCL )?(INFO|WARN) (.*)$")  # "INFO ..." alone: a tool cut the prefix
_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_IB_DEVICES = re.compile(r"^NET/IB\s*: Using (.*?)(?:;\s*OOB .*)?$")
_IB_DEVICE = re.compile(r"\[(\d+)\]([^\s:\[\]]+):(\d+)/(IB|RoCE)\b")
_SOCKET_DEVICES = re.compile(r"^NET/Socket\s*: Using (\[\d+\].*)$")
_SOCKET_DEVICE = re.compile(r"\[(\d+)\]([^\s:\[\]]+):")
_CONNECTION = re.compile(r"^Channel \d+(?:/\d+)? : .* via NET/([^/]+)/(\d+)(/GDRDMA)?")
_GDR_HCA = re.compile(
    r"^NET/([^:]+?)\s*: GPU Direct RDMA (?:\(([^)]*)\) )?(Disabled|enabled|Enabled)"
    r" for HCA (\d+) '([^']*)'?"
)
_VERSION = re.compile(r"^(?:NCCL version )?(\d+\.\d+\.\d+)\+cuda")

EXPECT_TRANSPORTS = ("any", "ib", "roce", "socket")
EXPECT_GDR = ("any", "true", "false")
FLOOR_KEYS = {"IB": "rdma", "RoCE": "rdma", "IB/RoCE": "rdma", "Socket": "socket", "gloo": "gloo"}
FLOOR_SETTINGS = {
    "rdma": "smoke_training_min_busbw_rdma_gbps",
    "socket": "smoke_training_min_busbw_socket_gbps",
    "gloo": "smoke_training_min_busbw_gloo_gbps",
}


# --------------------------------------------------------------------------- one rank's lines


def _body(line: str) -> tuple[str, str]:
    """("INFO"|"WARN"|"", the text after NCCL's prefix, or the stripped line without one)."""
    match = _BODY.search(line)
    return (match.group(1), match.group(2).strip()) if match else ("", line.strip())


def parse_log(text: str) -> dict[str, Any]:
    """The lines of interest of one log (any number of ranks): networks chosen, HCAs, socket interfaces,
    NET connections, per-HCA GPUDirect RDMA lines, the NCCL version, warnings and the evidence lines."""
    found: dict[str, Any] = {
        "networks": [],
        "hcas": [],
        "sockets": [],
        "connections": [],
        "gdr_hcas": [],
        "version": None,
        "warnings": [],
        "evidence": [],
    }

    def note(line: str) -> None:
        if len(found["evidence"]) < MAX_EVIDENCE and line not in found["evidence"]:
            found["evidence"].append(line)

    def keep(key: str, value: Any, line: str) -> None:
        if value not in found[key]:
            found[key].append(value)
            note(line)

    for raw in text.splitlines():
        level, body = _body(raw)
        line = raw.strip()
        if level == "WARN":
            if body not in found["warnings"] and len(found["warnings"]) < MAX_WARNINGS:
                found["warnings"].append(body)
        elif (match := _VERSION.match(body)) and found["version"] is None:
            found["version"] = match.group(1)
        elif match := _NETWORK.match(body):
            keep("networks", match.group(1), line)
        elif match := _IB_DEVICES.match(body):
            for dev in _IB_DEVICE.finditer(match.group(1)):
                keep("hcas", {"name": dev.group(2), "port": int(dev.group(3)), "link": dev.group(4)}, line)
        elif match := _SOCKET_DEVICES.match(body):
            for dev in _SOCKET_DEVICE.finditer(match.group(1)):
                keep("sockets", dev.group(2), line)
        elif match := _CONNECTION.match(body):
            connection = {"net": match.group(1), "dev": int(match.group(2)), "gdr": bool(match.group(3))}
            if not any(c["net"] == connection["net"] and c["gdr"] == connection["gdr"] for c in found["connections"]):
                note(line)  # the first connection of each kind
            found["connections"].append(connection)
        elif match := _GDR_HCA.match(body):
            keep(
                "gdr_hcas",
                {
                    "net": match.group(1),
                    "hca": match.group(5),
                    "via": match.group(2),
                    "enabled": match.group(3).lower() == "enabled",
                },
                line,
            )
    return found


# --------------------------------------------------------------------------- a node's reading


def _ib_family(net: str) -> bool:
    """NCCL's verbs transport: its own IB, the SHARP plugin's IBext / IBext_v8, NVIDIA's "NCCL RDMA Plugin"."""
    return net.startswith("IB") or "RDMA" in net


def summarize(parsed: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One node's reading from its ranks' parse_log results (see the module docstring)."""
    logs = list(parsed)
    networks = _unique(n for log in logs for n in log["networks"])
    hcas = _unique(h for log in logs for h in log["hcas"])
    sockets = _unique(s for log in logs for s in log["sockets"])
    connections = [c for log in logs for c in log["connections"]]
    gdr_hcas = _unique(g for log in logs for g in log["gdr_hcas"])
    nets = _unique(c["net"] for c in connections) or networks
    if not nets and (hcas or any(g["net"] == "IB" for g in gdr_hcas)):
        nets = ["IB"]
    transports = _unique(_transport(net, hcas) for net in nets)
    transport = transports[0] if len(transports) == 1 else (" + ".join(transports) or None)
    rdma = [c for c in connections if c["net"] != "Socket"]
    if transport == "Socket":
        gdr, basis = "off", "Socket: data goes through host memory"
    elif rdma:
        with_gdr = sum(c["gdr"] for c in rdma)
        gdr = "on" if with_gdr == len(rdma) else ("off" if with_gdr == 0 else "partial")
        basis = f"{with_gdr} of {len(rdma)} NET connection(s) via /GDRDMA"
    elif gdr_hcas:
        enabled = {g["hca"] for g in gdr_hcas if g["enabled"]}
        disabled = {g["hca"] for g in gdr_hcas if not g["enabled"]} - enabled
        gdr = "on" if not disabled else ("off" if not enabled else "partial")
        basis = (
            f"HCA lines (no NET connection logged): enabled on {', '.join(sorted(enabled)) or 'none'}, "
            f"disabled on {', '.join(sorted(disabled)) or 'none'}"
        )
    else:
        gdr, basis = None, "no GPUDirect RDMA line in the log"
    return {
        "logs": len(logs),
        "transport": transport,
        "gdr": gdr,
        "gdr_basis": basis,
        "crossed": bool(connections),
        "networks": nets,
        "hcas": hcas,
        "sockets": sockets,
        "connections": {"total": len(connections), "gdr": sum(c["gdr"] for c in connections)},
        "version": next((log["version"] for log in logs if log["version"]), None),
        "warnings": _unique(w for log in logs for w in log["warnings"])[:MAX_WARNINGS],
        "evidence": _unique(e for log in logs for e in log["evidence"])[:MAX_EVIDENCE],
    }


def _transport(net: str, hcas: Sequence[Mapping[str, Any]]) -> str:
    if net == "Socket":
        return "Socket"
    if not _ib_family(net):
        return net
    links = {h["link"] for h in hcas}
    return links.pop() if len(links) == 1 else "IB/RoCE"


def _unique(values: Iterable[Any]) -> list[Any]:
    seen: list[Any] = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen


def read_logs(directory: str | Path) -> dict[str, Any] | None:
    """The node's reading from the NCCL_DEBUG_FILE files in directory; None when NCCL wrote none (gloo)."""
    files = sorted(Path(directory).glob(LOG_GLOB))
    if not files:
        return None
    return summarize(parse_log(f.read_text(errors="replace")) for f in files)


def debug_env(directory: str | Path) -> dict[str, str]:
    """The environment that makes every rank write its NCCL log (INIT and NET) into directory."""
    return {**DEBUG_ENV, "NCCL_DEBUG_FILE": str(Path(directory) / LOG_NAME)}


# --------------------------------------------------------------------------- the judgement


def _gbps(value: Any) -> str:
    return f"{float(value):.3g} GB/s"


def _expect_gdr(value: Any) -> str:
    """Ansible may hand the setting over as a boolean (YAML true) or a string."""
    text = str(value).strip().lower()
    return {"yes": "true", "on": "true", "no": "false", "off": "false"}.get(text, text)


def judge(
    network: Mapping[str, Any] | None,
    nodes: Sequence[Mapping[str, Any]],
    floors: Mapping[str, Any],
    expect_transport: str = "any",
    expect_gdr: Any = "any",
) -> dict[str, Any]:
    """The smoke training's network verdict.

    network: the payload's ``network`` (train_measure.py's time_all_reduce: backend, measured, size_bytes,
    world / inter_node {ranks, seconds, algbw_gbps, busbw_gbps}), None when it measured nothing;
    nodes: each node's launcher output ({"host", "nccl": read_logs() or None}); floors:
    {"rdma", "socket", "gloo"} in GB/s (0: not judged); the expectations as the role's settings.
    Any mappings and sequences do (Ansible's own, through the filter); TypeError or ValueError for input it
    cannot judge.
    Returns {verdict, problems, notes, measured, transport, gdr, busbw_gbps, floor_gbps, label, nodes}.
    """
    if network is not None and not isinstance(network, Mapping):
        raise TypeError(f"the payload's network figures must be a mapping, got {network!r}")
    nodes, floors = nodes or (), floors or {}
    problems: list[str] = []
    notes: list[str] = []
    expect_gdr, expect_transport = _expect_gdr(expect_gdr), str(expect_transport).strip().lower()
    if expect_transport not in EXPECT_TRANSPORTS or expect_gdr not in EXPECT_GDR:
        raise ValueError(
            f"expect_transport {expect_transport!r} (one of {', '.join(EXPECT_TRANSPORTS)}) or "
            f"expect_gdr {expect_gdr!r} (one of {', '.join(EXPECT_GDR)}) is not known"
        )
    backend = (network or {}).get("backend")
    inter = (network or {}).get("inter_node") or {}
    busbw, crossing = inter.get("busbw_gbps"), int(inter.get("ranks") or 0)
    per_node = [{"host": n.get("host"), **_node_view(n.get("nccl"))} for n in nodes]
    transport = gdr = None
    if network is None:
        notes.append("bus bandwidth not measured (no process group, or smoke_training_busbw_mib 0)")
    if backend == "nccl":
        readings = [n for n in per_node if n["transport"] is not None or n["gdr"] is not None]
        transports = _unique(n["transport"] for n in per_node)
        gdrs = _unique(n["gdr"] for n in per_node)
        transport = transports[0] if len(transports) == 1 else None
        gdr = gdrs[0] if len(gdrs) == 1 else None
        if not readings:
            problems.append("NCCL's log named no transport on any node (NCCL_DEBUG_FILE unreadable?)")
        elif len(transports) > 1:
            problems.append(
                "the nodes used different transports: "
                + ", ".join(f"{n['host']} {n['transport'] or 'none logged'}" for n in per_node)
            )
        if len(gdrs) > 1 and not problems:
            notes.append(
                "GPUDirect RDMA differs between nodes: "
                + ", ".join(f"{n['host']} {n['gdr'] or 'not logged'}" for n in per_node)
            )
    elif backend is not None:
        notes.append(f"transport not read: the run used {backend}, not NCCL (NCCL's log exists only for NCCL)")
    label = _label(network, transport, gdr)
    if crossing < 2 and network is not None:
        notes.append("one node: no all-reduce crossed nodes, nothing judged between nodes")
    multi = crossing >= 2
    if multi and expect_transport != "any":
        want = {"ib": "IB", "roce": "RoCE", "socket": "Socket"}[expect_transport]
        for node in _nodes_off(
            problems,
            backend,
            per_node,
            "transport",
            want,
            f"NCCL over {want} between nodes (smoke_training_expect_transport)",
            " (no GPU?)",
        ):
            problems.append(
                f"{node['host']}: NCCL used {node['transport'] or 'no logged transport'} "
                f"between nodes, expected {want} (smoke_training_expect_transport)"
                + (f" [{node['evidence'][0]}]" if node["evidence"] else "")
            )
    if multi and expect_gdr != "any":
        want_gdr = "on" if expect_gdr == "true" else "off"
        for node in _nodes_off(
            problems,
            backend,
            per_node,
            "gdr",
            want_gdr,
            f"GPUDirect RDMA {want_gdr} (smoke_training_expect_gdr)",
            ", not NCCL",
        ):
            problems.append(
                f"{node['host']}: GPUDirect RDMA {node['gdr'] or 'not logged'} "
                f"({node['gdr_basis']}), expected {want_gdr} (smoke_training_expect_gdr)"
            )
    key = "gloo" if backend == "gloo" else FLOOR_KEYS.get(transport or "")
    floor = float(floors.get(key) or 0) if key else 0.0
    if multi and floor > 0:
        size = int((network or {}).get("size_bytes") or 0) / 2**20
        if busbw is None or busbw < floor:
            problems.append(
                f"cross-node all-reduce bus bandwidth {_gbps(busbw) if busbw is not None else 'not measured'}"
                f" (one rank per node, {crossing} nodes, {size:g} MiB, {label}) is below the floor "
                f"{_gbps(floor)} ({FLOOR_SETTINGS[key]})"
            )
    elif multi and backend is not None:
        notes.append(
            f"bus bandwidth not judged: no floor for {label}" + (f" ({FLOOR_SETTINGS[key]} is 0)" if key else "")
        )
    return {
        "verdict": "fail" if problems else "pass",
        "problems": problems,
        "notes": notes,
        "measured": label,
        "backend": backend,
        "transport": transport,
        "gdr": gdr,
        "busbw_gbps": busbw,
        "world_busbw_gbps": ((network or {}).get("world") or {}).get("busbw_gbps"),
        "nodes_crossed": crossing,
        "floor_gbps": floor if key else None,
        "floor_setting": FLOOR_SETTINGS.get(key or ""),
        "nodes": per_node,
    }


def _node_view(reading: Mapping[str, Any] | None) -> dict[str, Any]:
    keys = ("transport", "gdr", "gdr_basis", "networks", "hcas", "version", "warnings", "evidence")
    if reading is None:
        return {**{key: None for key in keys}, "evidence": [], "warnings": []}
    return {key: reading.get(key) for key in keys}


def _nodes_off(
    problems: list[str],
    backend: str | None,
    per_node: list[dict[str, Any]],
    key: str,
    want: str,
    expected: str,
    not_nccl: str,
) -> list[dict[str, Any]]:
    """The nodes whose reading of key is not want, for the caller to name; none, and the problem that the
    run did not use NCCL (whose log is what is read) added, when backend is not NCCL."""
    if backend != "nccl":
        problems.append(f"expected {expected}, but the run used {backend}{not_nccl}")
        return []
    return [node for node in per_node if node[key] != want]


def _label(network: Mapping[str, Any] | None, transport: str | None, gdr: str | None) -> str:
    """What the figure measured, in words: "gloo over TCP", "NCCL over IB (GPUDirect RDMA on)"."""
    if network is None:
        return "nothing measured"
    if network.get("backend") != "nccl":
        return str(network.get("measured") or network.get("backend"))
    if transport is None:
        return "NCCL (transport not logged or not the same on every node)"
    return f"NCCL over {transport}" + (f" (GPUDirect RDMA {gdr})" if gdr else "")
