"""``gpu-node-agent nats setup``: the admin step that creates, or verifies, every JetStream stream and KV bucket.

No other role creates a stream or bucket under the shipped permission layout (fleet/nats_permissions.py): one
that could would choose its settings, and a JetStream ``republish`` (or ``sources``, a ``mirror``, a subject
transform) moves messages onto subjects its own permissions never allowed (#20: node A's GNA_SIGNALS republished
onto ``gna.events.<node B>.…`` cordoned B). So the admin runs this once, before the fleet connects, and again
after any change of names or settings: it is idempotent. Each stream and bucket is created from exactly the
settings the code uses (``agent.nats_link.stream_configs``, each bucket's own ``bucket_config``) or, when it
exists, verified with the one check every opener uses (``agent.nats_link.verify_stream``): an existing one
carrying a republish, sources, a mirror, a subject transform or subjects it did not ask for is refused, never
changed. Operator tuning (``max_age``, ``max_bytes``, replicas, history) is kept and reported.

Exit codes (sysexits(3)): ``EXIT_CODES`` below, which ``--help`` prints.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent import config as configmod
from agent.cliargs import EX_CONFIG, EX_UNAVAILABLE, Parser, add_nats, nats_config, nats_servers, positive_float

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.api import KeyValueConfig, StreamConfig

EX_OK = 0
EX_DATAERR = 65  # an existing stream or bucket carries settings setup did not ask for: refused
EX_NOINPUT = 66  # --check: a stream or bucket is missing
EX_NOPERM = 77  # missing, and the server did not create it
EXIT_CODES = {
    EX_OK: "every stream and bucket exists and was verified (or created)",
    EX_DATAERR: "at least one exists with foreign settings (refused: inspect it, delete it, run setup again)",
    EX_NOINPUT: "with --check, at least one is missing",
    EX_UNAVAILABLE: "NATS unreachable within --connect-timeout (one line on stderr)",
    EX_NOPERM: "one is missing and the server did not create it (these are not the admin's credentials, or the "
               "server refused the settings: the line says)",
    EX_CONFIG: "a configuration error (file, line, key, the closest valid key), or no NATS URL",
}

# Settings an operator may tune after setup (reported, never refused): StreamConfig field -> how to print it.
TUNABLE = ("max_age", "max_bytes", "max_msgs_per_subject", "num_replicas", "duplicate_window", "storage", "discard")


@dataclass(frozen=True)
class Wanted:
    """One stream (``stream`` set) or KV bucket (``bucket`` set) the fleet uses, as setup creates it."""

    name: str
    stream: StreamConfig | None = None
    bucket: KeyValueConfig | None = None

    @property
    def kind(self) -> str:
        return "stream" if self.stream is not None else "bucket"


@dataclass
class Outcome:
    kind: str
    name: str
    status: str  # created | verified | refused | missing | not-created
    detail: str = ""


def wanted(cfg: configmod.AgentConfig, *, lease_ttl: float | None = None) -> list[Wanted]:
    """Every stream and bucket of the fleet, named and configured as the code that uses it names and configures it."""
    from nats.js.api import KeyValueConfig

    from agent.nats_link import stream_configs
    from agent.remediation.budget import FleetBudget
    from agent.remediation.incidents import INCIDENTS_BUCKET
    from fleet import leases
    from fleet.stragglers import STRAGGLERS_BUCKET

    replicas = cfg.nats.stream_replicas
    out = [Wanted(str(s.name), stream=s) for s in stream_configs(cfg.nats)]
    buckets = [
        KeyValueConfig(bucket=cfg.nats.kv_bucket, history=1, replicas=replicas),  # agent.nats_link.NatsLink.kv
        FleetBudget.for_agent(None, cfg).bucket_config(),
        # fleet/incidents.py, fleet/cordoner.py: the current incident per job, a few revisions kept
        KeyValueConfig(bucket=INCIDENTS_BUCKET, history=5, replicas=replicas),
        KeyValueConfig(bucket=STRAGGLERS_BUCKET, history=5, replicas=replicas),  # fleet/incidents.py
        leases.bucket_config(ttl=leases.DEFAULT_TTL if lease_ttl is None else lease_ttl, replicas=replicas),
    ]
    return out + [Wanted(b.bucket, bucket=b) for b in buckets]


def _tuned(have: Any, want: StreamConfig) -> str:
    diffs = [f"{f} {getattr(have, f)!s} (setup's {getattr(want, f)!s})" for f in TUNABLE
             if getattr(want, f, None) is not None and getattr(have, f, None) != getattr(want, f)]
    return ("tuned: " + ", ".join(diffs)) if diffs else ""


async def _exists(js: JetStreamContext, stream: str) -> bool:
    from nats.js.errors import NotFoundError

    try:
        await js.stream_info(stream)
    except NotFoundError:
        return False
    return True


async def setup_one(js: JetStreamContext, item: Wanted, *, create: bool = True) -> Outcome:
    """Create ``item`` if it is missing (and ``create``), else verify it; never change an existing one."""
    from agent.nats_link import StreamMissing, StreamRefused, ensure_stream, kv_stream_config, open_kv

    try:
        if item.stream is not None:
            status = await ensure_stream(js, item.stream, create=create)
            want = item.stream
        else:
            assert item.bucket is not None
            want = kv_stream_config(item.name)
            existed = await _exists(js, str(want.name))
            await open_kv(js, item.name, create_with=item.bucket if create else None)
            status = "verified" if existed else "created"
        detail = ""
        if status == "verified" and item.stream is not None:
            detail = _tuned((await js.stream_info(item.name)).config, item.stream)
        return Outcome(item.kind, item.name, status, detail)
    except StreamRefused as exc:
        return Outcome(item.kind, item.name, "refused", str(exc))
    except StreamMissing as exc:
        return Outcome(item.kind, item.name, "not-created" if create else "missing", str(exc))


async def setup(js: JetStreamContext, items: list[Wanted], *, create: bool = True) -> list[Outcome]:
    """Every item, in order; one refused or missing does not stop the others being created or verified."""
    return [await setup_one(js, item, create=create) for item in items]


def exit_code(outcomes: list[Outcome]) -> int:
    statuses = {o.status for o in outcomes}
    for status, code in (("refused", EX_DATAERR), ("not-created", EX_NOPERM), ("missing", EX_NOINPUT)):
        if status in statuses:
            return code
    return EX_OK


def render(outcomes: list[Outcome]) -> str:
    width = max((len(o.name) for o in outcomes), default=0)
    lines = []
    for o in outcomes:
        line = f"{o.status.upper() if o.status in ('refused', 'missing', 'not-created') else o.status:<11} " \
               f"{o.kind:<6} {o.name:<{width}}"
        lines.append(f"{line}  {o.detail}".rstrip())
    return "\n".join(lines)


def add_command(sub: argparse._SubParsersAction[Parser]) -> None:
    from fleet import leases  # light: fleet/cli.py imports it too

    nats_p = sub.add_parser("nats", help="NATS administration: create and verify the fleet's streams and buckets",
                            description="NATS administration: 'nats setup' creates, or verifies, every JetStream "
                            "stream and KV bucket the fleet uses, with the admin's credentials, before the fleet "
                            "connects.", exit_codes=EXIT_CODES)
    nats_sub = nats_p.add_subparsers(dest="nats_command", required=True, parser_class=Parser)
    s = nats_sub.add_parser(
        "setup", help="create (or verify) every stream and KV bucket: the admin step, before the fleet connects",
        description="Create, or verify, every JetStream stream and KV bucket of the fleet: the admin step, before "
        "the fleet connects.\n\n" + (__doc__ or "").split("\n\n")[1].replace("``", "`"), exit_codes=EXIT_CODES)
    add_nats(s, state_dir=False)
    s.add_argument("--check", action="store_true", help="create nothing: only verify; exit 66 if one is missing")
    s.add_argument("--lease-ttl", type=positive_float, help="the correlator's --lease-ttl: entries of the leases "
                   f"bucket expire after this many seconds (default {leases.DEFAULT_TTL:g}, the correlator's)")
    s.set_defaults(handler=cmd_nats_setup)


def cmd_nats_setup(args: argparse.Namespace) -> int:
    from agent.natsclient import connect

    cfg = configmod.load(args.config).agent
    ncfg = nats_config(args)
    servers = nats_servers(args)
    items = wanted(cfg, lease_ttl=args.lease_ttl)

    async def go() -> list[Outcome]:
        nc = await connect(servers, cfg=ncfg, name="gpu-node-agent-nats-setup", inbox="admin")
        try:
            return await setup(nc.jetstream(timeout=max(ncfg.publish_timeout, 5.0)), items, create=not args.check)
        finally:
            await nc.close()

    outcomes = asyncio.run(go())
    print(render(outcomes))
    rc = exit_code(outcomes)
    if rc:
        print({EX_DATAERR: "gpu-node-agent nats setup: refused: a stream or bucket carries settings setup did not "
                           "ask for (above); nothing was changed",
               EX_NOPERM: "gpu-node-agent nats setup: a stream or bucket is missing and was not created (above): "
                          "run setup with the admin's credentials",
               EX_NOINPUT: "gpu-node-agent nats setup --check: a stream or bucket is missing (above)"}[rc],
              file=sys.stderr)
    return rc
