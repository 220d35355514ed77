"""``gpu-node-agent demo``: added through the ``gpu_node_agent.commands`` entry point."""

from __future__ import annotations

import argparse

from agent.cliargs import Parser, positive_float, positive_int


def add_commands(sub: argparse._SubParsersAction[Parser]) -> None:
    demo = sub.add_parser(
        "demo", help="agent + embedded NATS on a simulated GPU node, with scripted faults",
        description="A simulated fleet on this machine, no GPU needed: a nats-server with JetStream, --nodes real "
        "agent processes each on its own simulated GPU node (a directory laid out like /sys, /proc and /dev), the "
        "correlator, the fleet dashboard (its URL is printed) and a scripted fault scenario, printed as it happens. "
        "Remediation runs in dry-run: the audits say what it would do. It ends by itself after --duration.",
        exit_codes={0: "the scenario ran and every agent exited 0 (a temporary directory is then removed)",
                    1: "something failed (NATS setup, an agent's exit status): the state and logs are kept and their "
                       "directory printed"})
    demo.add_argument("--duration", type=positive_float, default=30.0,
                      help="end the demo after this many seconds (default 30)")
    demo.add_argument("--workdir", help="keep the simulated nodes, state and logs here (default: a temporary "
                                        "directory, removed at the end)")
    demo.add_argument("--keep", action="store_true", help="keep the temporary directory (its path is printed)")
    demo.add_argument("--nodes", type=positive_int, default=8, help="simulated nodes, each a real agent process "
                      "(default 8)")
    demo.add_argument("--port", type=int, default=8080, help="dashboard port (0, or taken: any free port)")
    demo.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from sim.demo import run_demo

    return run_demo(duration=args.duration, workdir=args.workdir, nodes=args.nodes, port=args.port,
                    keep=args.keep)
