"""``gpu-node-agent validate``: the active checks once, for an operator, a Slurm prolog or an init container.

Exit status (also in --help): 0 every check that ran passed, 1 a check failed, 66 the host root does not
exist, 69 no check could run (every tool absent), 75 refused: a process holds a GPU (EX_TEMPFAIL: try again
when the job is gone; --force runs anyway), 78 a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import msgspec

from agent import config as configmod
from agent.cliargs import EX_CONFIG, EX_NOINPUT, EX_UNAVAILABLE, Parser, load_config
from gna_sdk.hostroot import HostRoot
from gna_types.validation import CHECKS, LEVELS, ValidationReport

EX_FAILED = 1
EX_TEMPFAIL = 75  # sysexits(3): a temporary failure, try again later
EXIT = {"passed": 0, "failed": EX_FAILED, "busy": EX_TEMPFAIL, "unavailable": EX_UNAVAILABLE}


def add_command(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "validate", help="active checks: NCCL all-reduce, nvbandwidth, dcgmi diag, GPUDirect RDMA; exit 0/1/75",
        description="Run the active checks of a level against the node's SKU thresholds (docs/validate.md): "
                    "quick = the passive checks + a short all_reduce_perf; standard = quick + nvbandwidth + dcgmi "
                    "diag -r 2 + a GPUDirect (ib_write_bw with CUDA) loopback per active InfiniBand port; "
                    "full = standard with an all_reduce_perf size sweep, dcgmi diag -r 3 and longer runs. A check "
                    "whose tool is absent is skipped with the reason. Refused while any process holds a GPU (read "
                    "from /proc), unless --force.",
        exit_codes={0: "every check that ran passed (skipped checks are listed)",
                    EX_FAILED: "a check failed: figures under threshold, #wrong > 0, a failed diagnostic, a tool "
                               "error or timeout",
                    EX_NOINPUT: "the host root does not exist or is not a directory",
                    EX_UNAVAILABLE: "no check could run (every tool absent, or skipped)",
                    EX_TEMPFAIL: "refused: processes hold the GPUs, or it cannot be told (retry later, or --force)",
                    EX_CONFIG: "a configuration error (file, line, key, the closest valid key)"})
    p.add_argument("--level", choices=LEVELS, default="quick", help="which checks run (default quick)")
    p.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")
    p.add_argument("--config", help=f"TOML config (default {configmod.DEFAULT_CONFIG_PATH} when it exists): its "
                                    "[validate] section")
    p.add_argument("--host-root", help="directory every host path is resolved under (default /)")
    p.add_argument("--node", help="node name in the report (default: the config's, else the host's hostname)")
    p.add_argument("--force", action="store_true", help="run even while processes hold the GPUs (default: refuse, "
                   "exit 75)")
    p.add_argument("--skip", action="append", choices=CHECKS, default=[],
                   help="a check not to run (repeatable; default: none)")
    p.set_defaults(handler=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> int:
    from agent.validate.checks import run_validation  # not for the daemon's parser: `run` never calls it

    cfg = load_config(args)
    root = Path(cfg.agent.host_root)
    if not root.is_dir():
        print(f"gpu-node-agent: host root {str(root)!r} does not exist or is not a directory", file=sys.stderr)
        return EX_NOINPUT
    report = asyncio.run(run_validation(cfg.agent, HostRoot(root), args.level, force=args.force,
                                        skip=args.skip, collectors=cfg.collectors))
    if args.format == "json":
        sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
    else:
        sys.stdout.write(render_text(report))
    return EXIT[report.verdict]


def render_text(report: ValidationReport) -> str:
    what = f"{report.gpu_count} x {report.gpu_model}" if report.gpu_count else "no GPU"
    sku = f"SKU {report.sku}, " if report.sku else ""
    lines = [f"validate {report.level} on {report.node} ({sku}{what}): {report.verdict.upper()}"]
    if report.verdict == "busy":
        lines.append(f"  {report.reason}")
    for c in report.checks:
        lines.append(f"  [{c.status:7}] {c.name}: {c.reason}" + (f" ({c.duration_s:.1f}s)" if c.duration_s else ""))
    lines += [f"  note: {n}" for n in report.notes]
    return "\n".join(lines) + "\n"
