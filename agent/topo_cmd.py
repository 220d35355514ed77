"""``gpu-node-agent topo``: the node's GPU/NIC distances as ``nvidia-smi topo -m`` prints them, from sysfs.

The topology itself lives in the ``topology`` collector plugin (collectors/topology.py). The node runtime
reaches plugins only through their entry point (the layering contract in pyproject.toml), so this
command loads it the way the daemon does: ``gpu_node_agent.collectors`` -> ``topology``, whose class
carries ``report()`` and ``render_text()``.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from agent import config as configmod
from agent.cliargs import EX_CONFIG, EX_NOINPUT, EX_UNAVAILABLE, Parser, load_config
from gna_sdk import ReportsTopology

COLLECTOR_GROUP = "gpu_node_agent.collectors"
PLUGIN = "topology"


def add_command(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "topo", help="GPU and NIC distances like nvidia-smi topo -m, read from sysfs",
        description="The node's GPU/NIC matrix in nvidia-smi topo -m's words (X, NV#, PIX, PXB, PHB, NODE, SYS), "
                    "read from the host root's /sys; NVLink counts from NVML when it loads.",
        exit_codes={0: "the matrix was printed (what could not be read is said on stderr)",
                    EX_NOINPUT: "the host root does not exist or is not a directory",
                    EX_UNAVAILABLE: f"the {PLUGIN} collector is not installed (entry point {COLLECTOR_GROUP}:{PLUGIN})",
                    EX_CONFIG: "a configuration error"})
    p.add_argument("--config", help=f"TOML config (default {configmod.DEFAULT_CONFIG_PATH} when it exists): its "
                                    "host_root when --host-root is not given")
    p.add_argument("--host-root", help="directory every host path is resolved under (default /)")
    p.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")
    p.add_argument("--pcie-only", action="store_true",
                   help="PCIe distances between GPUs even where NVLink joins them (like nvidia-smi topo -mp)")
    p.add_argument("--no-nvml", action="store_true",
                   help="do not ask NVML for NVLinks (a simulated or copied host root: NVML would describe this "
                        "machine, not that tree)")
    p.set_defaults(handler=cmd_topo)


def load_plugin() -> Any | None:
    """The topology collector class through its entry point, or None when no installed package has it."""
    for ep in entry_points(group=COLLECTOR_GROUP, name=PLUGIN):
        return ep.load()
    return None


def cmd_topo(args: argparse.Namespace) -> int:
    root = Path(args.host_root) if args.host_root else Path(load_config(args).agent.host_root)
    if not root.is_dir():
        print(f"gpu-node-agent: host root {str(root)!r} does not exist or is not a directory", file=sys.stderr)
        return EX_NOINPUT
    plugin = load_plugin()
    if plugin is None or not isinstance(plugin, ReportsTopology):  # a declared capability, not a getattr
        print(f"gpu-node-agent topo: the {PLUGIN!r} collector is not installed (entry point {COLLECTOR_GROUP}:"
              f"{PLUGIN})", file=sys.stderr)
        return EX_UNAVAILABLE
    report, notes = plugin.report(root, use_nvml=not args.no_nvml, pcie_only=args.pcie_only)
    for note in notes:
        print(f"gpu-node-agent topo: {note}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(with_nic_names(report), indent=2))
    else:
        sys.stdout.write(plugin.render_text(report))
    return 0


def with_nic_names(report: dict[str, Any]) -> dict[str, Any]:
    """The JSON matrix also under each NIC's RDMA device name (``"mlx5_0"`` beside ``"NIC0"``, as the
    legend maps them): a consumer looks a GPU-NIC distance up by the name it knows."""
    devices = report.get("devices")
    matrix = report.get("matrix")
    if not isinstance(devices, dict) or not isinstance(matrix, dict):
        return report
    alias = {k: d["name"] for k, d in devices.items()
             if isinstance(d, dict) and d.get("kind") == "nic" and isinstance(d.get("name"), str)
             and d["name"] not in devices}
    out = {row: {**cells, **{alias[c]: v for c, v in cells.items() if c in alias}}
           for row, cells in matrix.items() if isinstance(cells, dict)}
    for nic, name in alias.items():
        if nic in out:
            out[name] = out[nic]
    return {**report, "matrix": out}
