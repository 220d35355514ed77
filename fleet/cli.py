"""The central commands: events, top, dashboard, cordoner, budget, nats setup.

Added to ``gpu-node-agent`` through the ``gpu_node_agent.commands`` entry point; this module imports
nothing heavy, so listing the commands costs a node agent nothing. Each command imports its
implementation (aiohttp, rich: the ``[fleet]`` extra) only when it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from typing import Any

from agent import config as configmod
from agent.cliargs import (
    EX_CONFIG,
    EX_NOINPUT,
    EX_UNAVAILABLE,
    EX_USAGE,
    USAGE_ERROR,
    Parser,
    add_nats,
    nats_config,
    nats_servers,
    positive_float,
    positive_int,
)
from agent.natsclient import EX_TEMPFAIL
from fleet import leases

UNREACHABLE = "NATS unreachable within --connect-timeout (one line on stderr)"
CLOSED = "the NATS connection closed for good (one line on stderr; a supervisor restarts it)"
NO_FLEET_EXTRA = "or the [fleet] extra is not installed (the line says what to install)"
STOPPED = "stopped by SIGTERM/SIGINT or after --duration"
EX_OSERR = 71  # fleet/dashboard.py: cannot listen on --listen (the dashboard module imports aiohttp)
CONFIG = "a configuration error (file, line, key, the closest valid key), or no NATS URL"
LISTEN = "cannot listen on metrics.listen (--metrics-listen) for /metrics (one line on stderr)"
HOST_PORT = re.compile(r"^[^:]+:\d+$|^\[[0-9a-fA-F:]+\]:\d+$")  # agent/config.py's check of metrics.listen


# each central service's own default port: beside the node agent (9465) on one host, none takes another's
SERVICE_PORTS = {"correlator": 9466, "cordoner": 9467}


def add_metrics_listen(p: argparse.ArgumentParser, service: str) -> None:
    p.add_argument("--metrics-listen", help="HOST:PORT for /metrics and /healthz, '' disables (default: the "
                   "config's metrics.listen when it is set to other than the node agent's default, else "
                   f"127.0.0.1:{SERVICE_PORTS[service]}, this service's own port)")
    p.set_defaults(metrics_service=service)


def metrics_listen(args: argparse.Namespace, cfg: configmod.AgentConfig) -> str | None:
    """The address /metrics is served on ("" none), or None (printed) when --metrics-listen is not HOST:PORT.
    A config whose metrics.listen is the node agent's default (127.0.0.1:9465, the same file a node uses)
    gives the service its own port on that host, so a correlator and a cordoner beside an agent never
    take each other's."""
    listen = cfg.metrics.listen if args.metrics_listen is None else args.metrics_listen
    if args.metrics_listen is None and listen == configmod.MetricsConfig().listen:
        listen = f"127.0.0.1:{SERVICE_PORTS[args.metrics_service]}"
    if listen and not HOST_PORT.fullmatch(listen):
        print(f"gpu-node-agent: --metrics-listen wants HOST:PORT, got {listen!r}", file=sys.stderr)
        return None
    return str(listen)


def add_commands(sub: argparse._SubParsersAction[Parser]) -> None:
    ev = sub.add_parser("events", help="print fleet messages as JSON lines (history, or follow)",
                        description="Print the fleet's messages from the event stream, one JSON object a line. "
                        "Default: every stored message that matches, oldest first, then exit. --follow: then keep "
                        "printing new ones. --new: only new ones. stdout carries the messages only; what was "
                        "skipped (not schema-valid, not from its subject's node) is summed up on stderr.",
                        exit_codes={0: "the history was printed, or --count, --duration, SIGINT/SIGTERM or the "
                                       "reader of stdout leaving ended it",
                                    EX_UNAVAILABLE: UNREACHABLE, EX_TEMPFAIL: f"following: {CLOSED}",
                                    EX_CONFIG: CONFIG})
    add_nats(ev)
    ev.add_argument("--node", help="only messages from this node (default: every node)")
    ev.add_argument("--job", help="only messages about this job, as incidents name it (its ranks' symptoms: "
                    "details.job; default: every message)")
    ev.add_argument("--collector", help="only messages from this collector, e.g. infiniband (default: every "
                    "collector)")
    ev.add_argument("--severity", choices=["info", "warning", "critical"], help="only messages of this severity "
                    "(default: every severity)")
    mode = ev.add_mutually_exclusive_group()
    mode.add_argument("-f", "--follow", action="store_true", help="after the history, print new messages as they "
                      "arrive (until --count, --duration, a signal, or stdout's reader exits)")
    mode.add_argument("--new", action="store_true", help="skip the history: only messages from now on (follows)")
    mode.add_argument("--all", action="store_true", help="the whole history, then exit (the default; kept for "
                      "scripts)")
    ev.add_argument("--count", type=positive_int, help="exit after exactly this many messages (default: no limit)")
    ev.add_argument("--duration", type=positive_float, help="exit after this many seconds, whatever happened "
                    "(default: no limit)")
    ev.set_defaults(handler=cmd_events)

    budget_codes = {0: "the budget was printed (JSON)",
                    EX_UNAVAILABLE: f"{UNREACHABLE}, or the budget's KV bucket cannot be used", EX_CONFIG: CONFIG}
    budget = sub.add_parser("budget", help="the fleet-wide cordon budget",
                            description="The fleet-wide cordon budget in its NATS KV bucket (remediations.budget): "
                            "at most max_nodes, or max_percent of the nodes heartbeating, cordoned within the "
                            "window; a cordon that finds no free slot is skipped and audited.",
                            exit_codes=budget_codes)
    budget_sub = budget.add_subparsers(dest="budget_command", required=True, parser_class=Parser)
    for verb, text, what in (
            ("status", "print the budget (JSON): slots used, limit, window",
             "Print the fleet-wide cordon budget as JSON: the slots used, the limit, the window."),
            ("reset", "free every slot, then print the budget",
             "Free every slot of the fleet-wide cordon budget (once the cordons that took them are understood), "
             "then print it as JSON.")):
        b = budget_sub.add_parser(verb, help=text, description=what, exit_codes=budget_codes)
        add_nats(b)
    budget.set_defaults(handler=cmd_budget)

    cord = sub.add_parser("cordoner", help="central cordoner: fleet messages -> remediation with cluster credentials",
                          description="Decide the fleet's messages with the remediation rules and cluster "
                          "credentials (docs/remediation.md), so node agents need no Kubernetes rights; replicas "
                          "share the messages as a queue group. Only cluster-level actions (cordon, drain) run here; "
                          "node-local ones stay with the node agents. Dry-run unless --enforce (or the config's "
                          "remediations.enforce): every decision is audited on gna.actions.<node>.<remediation>.",
                          exit_codes={0: STOPPED,
                                      EX_UNAVAILABLE: "NATS JetStream unreachable at start within --connect-timeout "
                                                      "(one line on stderr)",
                                      EX_TEMPFAIL: CLOSED, EX_OSERR: LISTEN,
                                      EX_USAGE: f"{USAGE_ERROR}; --metrics-listen is not HOST:PORT",
                                      EX_CONFIG: "a configuration error (file, line, key, the closest valid key), or "
                                                 "neither --nats nor nats.servers"})
    add_nats(cord, state_dir=False, nats_default="the config's nats.servers; one of the two is required, the "
             "cordoner never uses a node agent's embedded server")
    cord.add_argument("--enforce", action="store_true", help="act (default: dry-run, every decision audited)")
    cord.add_argument("--duration", type=positive_float, help="stop by itself after this many seconds (default: "
                      "run until SIGTERM/SIGINT)")
    add_metrics_listen(cord, "cordoner")
    cord.set_defaults(handler=cmd_cordoner)

    dash = sub.add_parser("dashboard", help="central fleet dashboard (web, live over SSE)",
                          description="Serve the fleet dashboard over HTTP: the fleet overview, node pages, "
                          "incidents, the audit trail and timelines, live over server-sent events; built from the "
                          "event stream's recent history (--history-hours), then its new messages. Needs the "
                          "[fleet] extra.",
                          exit_codes={0: STOPPED, EX_USAGE: f"{USAGE_ERROR}; --listen is not HOST:PORT",
                                      EX_UNAVAILABLE: f"{UNREACHABLE}, {NO_FLEET_EXTRA}",
                                      EX_OSERR: "cannot listen on --listen", EX_TEMPFAIL: CLOSED, EX_CONFIG: CONFIG})
    add_nats(dash)
    dash.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT to serve on (port 0: any free port)")
    dash.add_argument("--history-hours", type=positive_float, default=6.0,
                      help="how much of the stream's history to load at start (default 6)")
    dash.add_argument("--duration", type=positive_float, help="stop by itself after this many seconds (default: "
                      "run until SIGTERM/SIGINT)")
    dash.add_argument("--ready-file", help="write the URL here once listening (default: none)")
    dash.set_defaults(handler=cmd_dashboard)

    corr = sub.add_parser("correlator", help="live fleet correlator: incidents (job, culprit, victims) on NATS",
                          description="Follow the event stream, group evidence by job, name each stalled job's "
                          "culprit and publish incidents on gna.incidents.<job> and the gna-incidents KV bucket "
                          "(docs/correlator.md). Replicas split the jobs: --partitions N, each with its own "
                          "--partition.",
                          exit_codes={0: STOPPED,
                                      EX_USAGE: f"{USAGE_ERROR}; --partition is not in 0..--partitions - 1; "
                                                "--metrics-listen is not HOST:PORT",
                                      EX_UNAVAILABLE: UNREACHABLE, EX_TEMPFAIL: CLOSED, EX_CONFIG: CONFIG,
                                      EX_OSERR: LISTEN})
    add_nats(corr)
    corr.add_argument("--partitions", type=positive_int, default=1, help="replicas sharing the jobs (default 1)")
    corr.add_argument("--partition", type=int, default=0, help="this replica's index, 0..partitions-1 (default 0)")
    corr.add_argument("--lease-ttl", type=float, default=leases.DEFAULT_TTL,
                      help="with several partitions: seconds after which a silent replica's partition is taken "
                           "over by a survivor (KV bucket gna-correlator-leases); 0 keeps the split static "
                           f"(default {leases.DEFAULT_TTL:g})")
    corr.add_argument("--straggler-interval", type=positive_float, default=10.0,
                      help="seconds between judgements of the fleet's straggler vectors (fleet/stragglers.py; "
                           "default 10)")
    corr.add_argument("--history-hours", type=positive_float, default=6.0,
                      help="stream history replayed at start to rebuild state (default 6)")
    corr.add_argument("--resolve-after", type=positive_float, default=600.0,
                      help="a job quiet this many seconds resolves its incident (default 600)")
    corr.add_argument("--duration", type=positive_float, help="stop by itself after this many seconds (default: "
                      "run until SIGTERM/SIGINT)")
    add_metrics_listen(corr, "correlator")
    corr.set_defaults(handler=cmd_correlator)

    export_codes = {0: STOPPED, EX_UNAVAILABLE: f"{UNREACHABLE}, or the [cloudevents] extra is not installed (the "
                    "line says what to install)", EX_NOINPUT: "--auth-file cannot be read",
                    EX_TEMPFAIL: CLOSED, EX_CONFIG: CONFIG}
    export_what = ("Forward every event and condition of the event stream to an HTTP receiver "
                   "as CloudEvents 1.0 (structured JSON; docs/exports.md). A durable consumer "
                   "(gna-export-cloudevents) is acknowledged only after the receiver's 2xx: at least once, "
                   "the message id as the event id. A receiver away or answering 408/429/5xx is retried "
                   "for as long as it takes; one refusing an event (another 4xx) has that event given up, "
                   "counted and logged.")
    exp = sub.add_parser("export", help="forward the fleet's events to another system (CloudEvents over HTTP)",
                         description=export_what, exit_codes=export_codes)
    exp_sub = exp.add_subparsers(dest="export_format", required=True, parser_class=Parser)
    ce = exp_sub.add_parser("cloudevents", help="CloudEvents 1.0 over HTTP (structured or batched)",
                            description=export_what, exit_codes=export_codes)
    otlp = exp_sub.add_parser("otlp", help="OpenTelemetry logs over OTLP/HTTP JSON (a collector's /v1/logs)",
                              description=export_what.replace("as CloudEvents 1.0 (structured JSON; docs/exports.md)",
                                                              "as OTLP/HTTP JSON logs (docs/exports.md)")
                              .replace("gna-export-cloudevents", "gna-export-otlp")
                              .replace("the message id as the event id", "the message id as attribute gna.id")
                              .replace("408/429/5xx", "429/502/503/504")
                              .replace("(another 4xx)", "(any other status)"),
                              exit_codes=export_codes)
    for p, fmt in ((ce, "cloudevents"), (otlp, "otlp")):
        add_nats(p)
        p.add_argument("--url", required=True, help="the receiver's HTTP(S) URL (" + (
            "a Knative broker, an event gateway)" if fmt == "cloudevents" else
            "an OpenTelemetry collector's, e.g. http://otel-collector:4318/v1/logs)"))
        p.add_argument("--batch", type=positive_int, default=64, help="messages fetched, and in batch mode sent, "
                       "at once (default 64)")
        p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                       help="an HTTP header for every request (repeatable)")
        p.add_argument("--auth-file", help="a file whose first line is the Authorization header's value (e.g. "
                       "'Bearer <token>'; kept out of the process list; default: no Authorization header)")
        p.add_argument("--type-prefix", default="io.github.gpu-node-agent",
                       help="reverse-DNS prefix of every event " + ("type" if fmt == "cloudevents" else "name") +
                       ": <prefix>.<collector>.<Type> (default io.github.gpu-node-agent)")
        p.add_argument("--new", action="store_true", help="a consumer created now starts at new messages (default: "
                       "the stream's stored history first); an existing consumer resumes where it stopped")
        p.add_argument("--durable", default=f"gna-export-{fmt}",
                       help="the durable consumer's name (the NATS layout's [names] "
                       f"{'export_durable' if fmt == 'cloudevents' else 'otlp_durable'}; default gna-export-{fmt})")
        p.add_argument("--duration", type=positive_float, help="stop by itself after this many seconds (default: "
                       "run until SIGTERM/SIGINT)")
        p.set_defaults(handler=cmd_export)
    ce.add_argument("--mode", choices=["single", "batch"], default="single",
                    help="single: one event a request (application/cloudevents+json); batch: a JSON array a "
                    "request (application/cloudevents-batch+json) (default single)")
    ce.add_argument("--source-prefix", default="/gpu-node-agent",
                    help="each event's source is <prefix>/nodes/<node> (default /gpu-node-agent)")

    diag = sub.add_parser("diagnose", help="correlate several nodes' snapshots: which job, which culprit",
                          description="The fleet correlator over several nodes' snapshots, for post-mortems, without "
                          "NATS. A snapshot is a node's host root (--host-root: each root's one-shot checks run here, "
                          "the node named by its etc/hostname), or what 'gpu-node-agent check --format json' printed "
                          "on a live node (--report FILE: taken on each node when it matters, e.g. by a Slurm epilog "
                          "or a kubectl exec; its messages are checked as the fleet checks the wire, a message naming "
                          "another node is refused and counted on stderr). Prints every node's critical findings, "
                          "then each incident with the evidence that decided it.",
                          exit_codes={0: "no incident and no node with a critical finding",
                                      2: "an incident, or a node with a critical finding (check's 2): printed",
                                      EX_USAGE: f"{USAGE_ERROR}; no snapshot given; two snapshots name the same node",
                                      EX_NOINPUT: "a host root or report does not exist, or a report is not one",
                                      EX_CONFIG: "a configuration error"})
    diag.add_argument("--host-root", action="append", default=[], help="a node's host root (repeatable)")
    diag.add_argument("--report", action="append", default=[],
                      help="a node's 'check --format json' output (repeatable)")
    diag.add_argument("--config", help=f"TOML config applied to every node (default {configmod.DEFAULT_CONFIG_PATH} "
                      "when it exists)")
    diag.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")
    diag.set_defaults(handler=cmd_diagnose)

    top = sub.add_parser("top", help="the fleet overview in the terminal",
                         description="The fleet overview in a terminal (rich: the [fleet] extra), worst nodes first, "
                         "with the correlator's open incidents above them, live until --duration or Ctrl-C. On a "
                         "terminal it fits the window; piped, it renders as wide as the content, or --width "
                         "columns. --once prints one snapshot, for scripts.",
                         exit_codes={0: "--once printed its snapshot, or --duration, Ctrl-C or SIGTERM ended it",
                                     EX_UNAVAILABLE: f"{UNREACHABLE}, {NO_FLEET_EXTRA}", EX_TEMPFAIL: CLOSED,
                                     EX_CONFIG: CONFIG})
    add_nats(top)
    top.add_argument("--once", action="store_true", help="print one snapshot and exit (for scripts and pipes)")
    top.add_argument("--duration", type=positive_float, help="stop by itself after this many seconds (default: "
                     "until Ctrl-C)")
    top.add_argument("--search", default="", help="only nodes whose name contains this text (default: every node)")
    top.add_argument("--width", type=positive_int, help="columns to render (default: the terminal's width; "
                     "piped: as wide as the content, nothing cut)")
    top.add_argument("--limit", type=positive_int, default=40, help="rows to show, worst first (default 40)")
    top.set_defaults(handler=cmd_top)

    from fleet.nats_setup import add_command as add_nats_command  # `nats setup`: the admin step

    add_nats_command(sub)


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Offline: each host root's one-shot checks, then the fleet correlator over all of them."""
    from pathlib import Path

    from agent.check import check_roots
    from agent.logsetup import configure
    from fleet import diagnose
    from fleet.correlator import correlate

    configure("error", "auto")
    if not args.host_root and not args.report:
        print("gpu-node-agent diagnose: give at least one --host-root or --report", file=sys.stderr)
        return EX_USAGE
    base = configmod.load(args.config)
    roots = [Path(r) for r in args.host_root]
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        print(f"gpu-node-agent: host root(s) missing or not directories: {', '.join(missing)}", file=sys.stderr)
        return EX_NOINPUT
    reports = asyncio.run(check_roots(roots, base)) if roots else []
    for path in args.report:
        try:
            report, refused = diagnose.load_report(Path(path))
        except diagnose.ReportError as exc:
            print(f"gpu-node-agent: {exc}", file=sys.stderr)
            return EX_NOINPUT
        if refused:
            print(f"gpu-node-agent: {path}: refused {sum(refused.values())} message(s) of node {report['node']!r} "
                  f"({', '.join(f'{k} {n}' for k, n in sorted(refused.items()))})", file=sys.stderr)
        reports.append(report)
    names = [r["node"] for r in reports]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        print(f"gpu-node-agent: several snapshots name the same node {dup} (a host root by its etc/hostname, a "
              "report by its node): their evidence would be mixed", file=sys.stderr)
        return EX_USAGE
    joined = diagnose.join_relayed(reports)  # each host's lines join its snapshot; shared files' lines once
    if joined["duplicates"] or joined["joined"]:
        print(f"gpu-node-agent: {joined['joined']} line(s) relayed from job-wide files joined their hosts' snapshots; "
              f"{joined['duplicates']} read by several snapshots kept once", file=sys.stderr)
    messages = [m for r in reports for m in r["conditions"] + r["events"]]
    incidents = [i.to_dict() for i in correlate(messages)]
    if args.format == "json":
        print(json.dumps(diagnose.summary(reports, incidents), indent=1))
    else:
        print(diagnose.render_text(reports, incidents))
    critical = any(r["status"] == "unhealthy" for r in reports)
    return 2 if incidents or critical else 0


def _serve(make: Any, ncfg: Any, duration: float | None) -> int:
    """A central service (``make()``: an object with async ``start`` and ``stop``) until SIGTERM/SIGINT,
    ``duration`` seconds, or its NATS connection closing for good (exit 75)."""
    from agent.natsclient import run_until_closed_or_stopped, watching
    from fleet.metrics import ListenError
    from gna_sdk.aio import within

    start = time.monotonic()

    async def go() -> int:
        watch = watching()  # the service's natsclient.connect() registers with it: closed for good -> exit 75
        svc = make()
        try:
            await within(svc.start(), ncfg.connect_timeout + 1)
        except ListenError as exc:
            print(f"gpu-node-agent: {exc}", file=sys.stderr)
            await svc.stop()
            return EX_OSERR
        rc = await run_until_closed_or_stopped(
            watch, None if duration is None else max(0.0, start + duration - time.monotonic()))
        await svc.stop()
        return rc

    return int(asyncio.run(go()))


def cmd_correlator(args: argparse.Namespace) -> int:
    from agent.logsetup import configure
    from fleet.incident_service import IncidentService
    from gna_types.subjects import JOB_BUCKETS

    cfg = configmod.load(args.config).agent
    configure(cfg.log.level, cfg.log.format)
    ncfg = nats_config(args)
    if not 0 <= args.partition < args.partitions:
        print(f"gpu-node-agent: --partition must be 0..{args.partitions - 1}", file=sys.stderr)
        return EX_USAGE
    if args.partitions > JOB_BUCKETS:  # a partition holds jobs' buckets (gna_types/subjects.py): one at least
        print(f"gpu-node-agent: --partitions must be at most {JOB_BUCKETS} (the jobs stream's buckets)",
              file=sys.stderr)
        return EX_USAGE
    listen = metrics_listen(args, cfg)
    if listen is None:
        return EX_USAGE
    return _serve(lambda: IncidentService(nats_servers(args), nats_cfg=ncfg, partitions=args.partitions,
                                          partition=args.partition, history_s=args.history_hours * 3600,
                                          resolve_after=args.resolve_after, lease_ttl=max(0.0, args.lease_ttl),
                                          straggler_interval=args.straggler_interval, metrics_listen=listen,
                                          freeze_heap=True),
                  ncfg, args.duration)


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from agent.logsetup import configure

    try:
        import aiohttp  # noqa: F401  (the sink's HTTP client)
    except ModuleNotFoundError:
        print("gpu-node-agent export: needs the [cloudevents] extra (module 'aiohttp' is not installed): "
              "pip install 'gpu-node-agent[cloudevents]'", file=sys.stderr)
        return EX_UNAVAILABLE
    from fleet.cloudevents import check_type_prefix
    from fleet.exporter import CloudEventsExporter, ExportSettings

    cfg = configmod.load(args.config).agent
    configure(cfg.log.level, cfg.log.format)
    headers: dict[str, str] = {}
    for h in args.header:
        name, sep, value = h.partition("=")
        if not sep or not name.strip():
            print(f"gpu-node-agent: --header wants NAME=VALUE, got {h[:80]!r}", file=sys.stderr)
            return EX_USAGE
        headers[name.strip()] = value
    if args.auth_file:
        try:
            headers["Authorization"] = Path(args.auth_file).read_text().splitlines()[0].strip()
        except (OSError, IndexError) as exc:
            print(f"gpu-node-agent: --auth-file {args.auth_file}: {exc if isinstance(exc, OSError) else 'empty'}",
                  file=sys.stderr)
            return EX_NOINPUT
    if not args.url.startswith(("http://", "https://")):
        print(f"gpu-node-agent: --url must be an http:// or https:// URL, got {args.url[:80]!r}", file=sys.stderr)
        return EX_USAGE
    try:
        check_type_prefix(args.type_prefix)
    except ValueError as exc:
        print(f"gpu-node-agent: --type-prefix: {exc}", file=sys.stderr)
        return EX_USAGE
    otlp = args.export_format == "otlp"
    settings = ExportSettings(url=args.url, mode="batch" if otlp else args.mode, batch=args.batch, headers=headers,
                              type_prefix=args.type_prefix, durable=args.durable, deliver_new=args.new,
                              source_prefix="" if otlp else args.source_prefix.rstrip("/"),
                              format=args.export_format)
    ncfg = nats_config(args)
    return _serve(lambda: CloudEventsExporter(nats_servers(args), settings, nats_cfg=ncfg), ncfg, args.duration)


def cmd_budget(args: argparse.Namespace) -> int:
    from agent.natsclient import connect
    from agent.remediation.budget import BudgetUnavailable, FleetBudget

    servers = nats_servers(args)
    cfg = configmod.load(args.config).agent
    ncfg = nats_config(args)

    async def go() -> dict[str, Any]:
        nc = await connect(servers, cfg=ncfg, name="gpu-node-agent-budget", inbox="admin")
        try:
            budget = FleetBudget.for_agent(nc.jetstream(), cfg)
            if args.budget_command == "reset":
                await budget.reset()
            return await budget.status()
        finally:
            await nc.close()

    try:
        print(json.dumps(asyncio.run(go()), indent=2))
    except BudgetUnavailable as exc:
        print(f"gpu-node-agent: the budget is unavailable: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    return 0


def cmd_cordoner(args: argparse.Namespace) -> int:
    from agent.logsetup import HeldLog, configure
    from agent.natsclient import NatsUnavailable
    from fleet.cordoner import run_cordoner
    from fleet.metrics import ListenError

    cfg = configmod.load(args.config).agent
    if args.enforce:
        cfg.remediations.enforce = True
    listen = metrics_listen(args, cfg)
    if listen is None:
        return EX_USAGE
    cfg.metrics.listen = listen
    held = HeldLog(sys.stderr)  # what it logs while connecting: shown once started; NATS unreachable is one line
    configure(cfg.log.level, cfg.log.format, stream=held)
    if args.connect_timeout:
        cfg.nats.connect_timeout = args.connect_timeout
    servers = list(args.nats or cfg.nats.servers)
    if not servers:
        raise configmod.ConfigError("the cordoner needs --nats or nats.servers")
    try:
        return asyncio.run(run_cordoner(cfg, servers, args.duration, started=held.release))
    except ListenError as exc:
        held.drop()
        print(f"gpu-node-agent: {exc}", file=sys.stderr)
        return EX_OSERR
    except NatsUnavailable:
        held.drop()  # main() prints the one line that says it all
        raise
    finally:
        held.release()  # anything else: what was logged is the evidence


def cmd_events(args: argparse.Namespace) -> int:
    import signal

    from agent.logsetup import configure
    from agent.natsclient import until_closed, watching
    from fleet.events import EventsQuery, quiet_broken_pipe, run_events

    configure("error", "auto")  # stdout is the messages only; the skip summary goes to stderr

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    servers = nats_servers(args)
    q = EventsQuery(node=args.node, job=args.job, collector=args.collector, severity=args.severity,
                    follow=args.follow, new_only=args.new, count=args.count, duration=args.duration)
    signal.signal(signal.SIGTERM, interrupted)  # a pipeline's SIGTERM ends it like Ctrl-C: exit 0

    async def go() -> int:  # a follower whose connection closed for good exits 75 (natsclient.until_closed)
        return await until_closed(run_events(servers, q, nats_config(args)), watching())

    try:
        return asyncio.run(go())
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        quiet_broken_pipe()
        return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from agent.logsetup import configure
    from fleet.dashboard import serve

    configure("info", "auto")
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        print(f"gpu-node-agent: --listen wants HOST:PORT, got {args.listen!r}", file=sys.stderr)
        return EX_USAGE
    return asyncio.run(serve(nats_servers(args), host or "127.0.0.1", int(port), duration=args.duration,
                             ready_file=args.ready_file, history_s=args.history_hours * 3600,
                             nats_cfg=nats_config(args)))


def cmd_top(args: argparse.Namespace) -> int:
    import signal

    from agent.logsetup import configure
    from agent.natsclient import until_closed, watching
    from fleet.top import run_top

    configure("error", "auto")

    async def go() -> int:  # a connection closed for good ends the screen with exit 75 (natsclient.until_closed)
        stop = asyncio.Event()  # Ctrl-C, SIGTERM: the screen ends and closes its feed, exit 0 (not a traceback)
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        return await until_closed(run_top(nats_servers(args), once=args.once, duration=args.duration, q=args.search,
                                          width=args.width, limit=args.limit, nats_cfg=nats_config(args), stop=stop),
                                  watching())

    return asyncio.run(go())
