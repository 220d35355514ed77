"""nats-server accounts and per-user permissions for a fleet (see docs/nats-security.md).

``python -m fleet.nats_permissions render LAYOUT.toml`` prints a nats-server config in which each node's
nkey may publish only its own subjects, the cordoner may act, readers may only read, and admins
may do anything. Every allowed subject is one the code really uses (listed per role in
docs/nats-security.md); a subject not listed is refused by the server. 1,000 nodes are 1,000
entries in the layout, rendered in well under a second.

``keygen`` writes a new user nkey seed (mode 0600) and prints its public key, for sites without
the ``nk``/``nsc`` tools.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tomllib
import unicodedata
from pathlib import Path

import msgspec

from fleet.leases import BEACON_PREFIX
from gna_types.subjects import (
    ACTIONS_PREFIX,
    BUDGET_BUCKET,
    CORDONER_DURABLE,
    EVENTS_PREFIX,
    EVENTS_STREAM,
    EXPORT_DURABLE,
    HEARTBEAT_PREFIX,
    INCIDENTS_BUCKET,
    INCIDENTS_PREFIX,
    JOBS_PREFIX,
    JOBS_STREAM,
    LEASES_BUCKET,
    NODES_BUCKET,
    OTLP_DURABLE,
    SIGNALS_PREFIX,
    SIGNALS_STREAM,
    STRAGGLERS_BUCKET,
    STRAGGLERS_PREFIX,
    VALIDATE_PREFIX,
    encode_token,
)

# A user public nkey: 'U' then base32, 56 characters in all.
_USER_NKEY = re.compile(r"^U[A-Z2-7]{55}$")
# A node name the layout accepts: a host name (RFC 1123 labels, as agent.config's _HOSTNAME, at most 253 characters),
# underscores allowed (Slurm and some inventories use them). Nothing else: the name is written into the rendered
# config (a comment line), and a newline in it would inject a config line that `nats-server -t` accepts (#20).
_NODE_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9_])?")
# [names]: JetStream stream, bucket and consumer names and the account are written unquoted or into subjects; NATS
# names allow no whitespace, '.', '*', '>' or path separators (https://docs.nats.io/running-a-nats-service/
# nats_admin/jetstream_admin/naming), and nats-py's bucket names are [a-zA-Z0-9_-]+ (nats/js/kv.py VALID_BUCKET_RE).
_NATS_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# The cordoner publishes its own alerts as if it were a node with this token (fleet/cordoner.py).
CORDONER_TOKEN = "cordoner"
BUDGET_KEY = "cordons"  # agent.remediation.budget.KEY: the budget bucket's only key
JS_API = "$JS.API"


class ServerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    listen: str = "0.0.0.0:4222"
    server_name: str = "gna-nats"
    store_dir: str = "/var/lib/nats/jetstream"
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""  # set: clients must present a certificate signed by this CA as well as their nkey


class Names(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Must match the agents' ``[nats] stream``/``kv_bucket`` and ``[remediations.budget] bucket``."""

    account: str = "GNA"
    stream: str = EVENTS_STREAM
    jobs_stream: str = JOBS_STREAM  # gna.jobs.<job>.<node>.member|evidence
    signals_stream: str = SIGNALS_STREAM  # gna.signals.<node>.<collector>: straggler vectors
    nodes_bucket: str = NODES_BUCKET
    budget_bucket: str = BUDGET_BUCKET
    cordoner_durable: str = CORDONER_DURABLE
    incidents_bucket: str = INCIDENTS_BUCKET  # fleet.incidents: the correlator's current incident per job
    leases_bucket: str = LEASES_BUCKET  # fleet.leases: which correlator replica judges which jobs
    stragglers_bucket: str = STRAGGLERS_BUCKET  # fleet.stragglers: the current straggler records
    export_durable: str = EXPORT_DURABLE  # fleet.exporter: the CloudEvents exporter's durable consumer
    otlp_durable: str = OTLP_DURABLE  # fleet.exporter: the OTLP logs exporter's durable consumer


class Roles(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    cordoner: list[str] = msgspec.field(default_factory=list)
    correlators: list[str] = msgspec.field(default_factory=list)
    readers: list[str] = msgspec.field(default_factory=list)
    exporters: list[str] = msgspec.field(default_factory=list)
    admins: list[str] = msgspec.field(default_factory=list)


class Layout(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    server: ServerSettings = msgspec.field(default_factory=ServerSettings)
    names: Names = msgspec.field(default_factory=Names)
    # True only when node agents run budgeted remediations (cordon/drain) themselves: each node can
    # then rewrite the fleet-wide budget. With the central cordoner, leave it off.
    node_budget: bool = False
    nodes: dict[str, str] = msgspec.field(default_factory=dict)  # node name -> user public nkey
    roles: Roles = msgspec.field(default_factory=Roles)


class Permissions(msgspec.Struct, kw_only=True):
    publish: list[str]
    subscribe: list[str]
    publish_deny: list[str] = msgspec.field(default_factory=list)


def load_layout(path: str | Path) -> Layout:
    text = Path(path).read_text(encoding="utf-8")
    try:
        layout = msgspec.convert(tomllib.loads(text), Layout)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    check_layout(layout)
    return layout


def bad_name(name: str) -> str | None:
    """Why ``name`` is not a node name the layout accepts (None: it is)."""
    for ch in name:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            return f"it contains the control or format character U+{ord(ch):04X}"
    if not _NODE_NAME.fullmatch(name):
        return ("a node name is a host name: letters, digits, '-', '_' and '.', at most 253 characters, "
                "starting and ending with a letter, digit or '_'")
    return None


def check_layout(layout: Layout) -> None:
    for field in msgspec.structs.fields(Names):
        value = getattr(layout.names, field.name)
        if not _NATS_NAME.fullmatch(value):
            raise ValueError(f"[names] {field.name} = {value!r}: a NATS name is 1-64 of A-Z a-z 0-9 '_' '-'")
    for name in layout.nodes:
        if (why := bad_name(name)) is not None:
            raise ValueError(f"[nodes] entry {name!r}: refused, {why}")
    seen: dict[str, str] = {}
    for who, key in [*((f"node {n!r}", k) for n, k in layout.nodes.items()),
                     *((f"cordoner #{i}", k) for i, k in enumerate(layout.roles.cordoner)),
                     *((f"correlator #{i}", k) for i, k in enumerate(layout.roles.correlators)),
                     *((f"reader #{i}", k) for i, k in enumerate(layout.roles.readers)),
                     *((f"exporter #{i}", k) for i, k in enumerate(layout.roles.exporters)),
                     *((f"admin #{i}", k) for i, k in enumerate(layout.roles.admins))]:
        if not _USER_NKEY.fullmatch(key):
            raise ValueError(f"{who}: {key!r} is not a user public nkey (U + 55 base32 characters)")
        if key in seen:  # nats-server would let the first entry win: a silent wrong role
            raise ValueError(f"{who} and {seen[key]} share the nkey {key}")
        seen[key] = who
    for name in layout.nodes:  # encode_token is one-to-one: distinct names never share subjects
        if encode_token(name) == CORDONER_TOKEN:
            raise ValueError(f"node {name!r}: its subject token is the cordoner's alert subject "
                             f"{EVENTS_PREFIX}.{CORDONER_TOKEN}.agent.critical")


def inbox(who: str) -> str:
    """The private reply inbox agent.nats_link.connect_options gives a node token or a central role."""
    return f"_INBOX_{who}.>"


def _kv_stream(bucket: str) -> str:
    return f"KV_{bucket}"


def node_permissions(node: str, layout: Layout) -> Permissions:
    n = layout.names
    token = encode_token(node)
    publish = [
        f"{EVENTS_PREFIX}.{token}.*.*",                 # the spool's events (forwarder, JetStream)
        f"{ACTIONS_PREFIX}.{token}.*",                  # its own remediation audits (via the spool)
        f"{JOBS_PREFIX}.*.{token}.*",                   # its jobs' membership and evidence (via the spool)
        f"{SIGNALS_PREFIX}.{token}.*",                  # its straggler vectors (via the spool)
        f"{HEARTBEAT_PREFIX}.{token}",                  # core NATS heartbeat
        f"$KV.{n.nodes_bucket}.{token}",               # its own state document
        # NatsLink.ensure_stream / NatsLink.kv() on every (re)connect verify each stream and the bucket
        # (agent.nats_link.verify_stream): INFO only. No role but the admin creates a stream or bucket (`gpu-node-agent
        # nats setup`): one that could would shape it (a republish onto another node's subjects, #20).
        f"{JS_API}.STREAM.INFO.{n.stream}",
        f"{JS_API}.STREAM.INFO.{n.jobs_stream}",
        f"{JS_API}.STREAM.INFO.{n.signals_stream}",
        f"{JS_API}.STREAM.INFO.{_kv_stream(n.nodes_bucket)}",
    ]
    if layout.node_budget:
        publish += [s for s in _budget_publish(layout) if s not in publish]
        # a node that cordons itself follows the correlator's incidents (never cordoned as a victim): read only
        publish += [s for s in _incidents_read(layout) if s not in publish]
    # the cordoner's request to validate itself before it is uncordoned (fleet/validations.py): its own only
    return Permissions(publish=publish, subscribe=[inbox(token), f"{VALIDATE_PREFIX}.{token}"])


def _budget_publish(layout: Layout) -> list[str]:
    """agent.remediation.budget.FleetBudget: the budget bucket (get, compare-and-set) and the node count."""
    n = layout.names
    budget, nodes = _kv_stream(n.budget_bucket), _kv_stream(n.nodes_bucket)
    return [
        f"{JS_API}.STREAM.INFO.{budget}",
        f"{JS_API}.STREAM.MSG.GET.{budget}",
        f"{JS_API}.DIRECT.GET.{budget}.>",  # a bucket created with allow_direct (e.g. by the nats CLI)
        f"$KV.{n.budget_bucket}.{BUDGET_KEY}",
        # fleet_size(): keys() of the nodes bucket is an ordered push consumer
        f"{JS_API}.STREAM.INFO.{nodes}",
        f"{JS_API}.CONSUMER.CREATE.{nodes}",
        f"{JS_API}.CONSUMER.INFO.{nodes}.*",
        f"$JS.FC.{nodes}.>",
    ]


def cordoner_permissions(layout: Layout) -> Permissions:
    n = layout.names
    publish = [
        f"{ACTIONS_PREFIX}.>",  # audits of what it did, for any node
        f"{EVENTS_PREFIX}.{CORDONER_TOKEN}.agent.critical",  # RemediationBudgetExhausted alerts
        f"{VALIDATE_PREFIX}.*",  # asks a cordoned node to validate itself (fleet/validations.py)
        f"{JS_API}.STREAM.INFO.{n.stream}",  # NatsLink.ensure_stream verifies every stream (never creates one)
        f"{JS_API}.STREAM.INFO.{n.jobs_stream}",
        f"{JS_API}.STREAM.INFO.{n.signals_stream}",
        f"{JS_API}.STREAM.NAMES",  # js.subscribe() without a stream looks it up by subject
        f"{JS_API}.CONSUMER.INFO.{n.stream}.{n.cordoner_durable}",
        f"{JS_API}.CONSUMER.DURABLE.CREATE.{n.stream}.{n.cordoner_durable}",
        f"$JS.ACK.{n.stream}.{n.cordoner_durable}.>",  # ack/term only its own durable's deliveries
        *_budget_publish(layout),
        *_incidents_read(layout),
        # one replica decides each incident update: a durable queue consumer on the bucket's stream
        f"{JS_API}.CONSUMER.DURABLE.CREATE.{_kv_stream(n.incidents_bucket)}.{n.cordoner_durable}-incidents",
        f"{JS_API}.CONSUMER.INFO.{_kv_stream(n.incidents_bucket)}.{n.cordoner_durable}-incidents",
        f"$JS.ACK.{_kv_stream(n.incidents_bucket)}.{n.cordoner_durable}-incidents.>",
    ]
    return Permissions(publish=publish, subscribe=[inbox("cordoner")])


def _incidents_read(layout: Layout) -> list[str]:
    """Watching the incidents bucket (an ordered push consumer on its stream), after verifying it (INFO)."""
    inc = _kv_stream(layout.names.incidents_bucket)
    return [
        f"{JS_API}.STREAM.INFO.{inc}",
        f"{JS_API}.CONSUMER.CREATE.{inc}",
        f"{JS_API}.CONSUMER.INFO.{inc}.*",
        f"$JS.FC.{inc}.>",
        f"{JS_API}.STREAM.MSG.GET.{inc}",  # one job's record (kv.get)
        f"{JS_API}.DIRECT.GET.{inc}.>",
    ]


def correlator_permissions(layout: Layout) -> Permissions:
    """fleet.incidents.IncidentService: reads the event stream like a reader, writes incidents only."""
    n = layout.names
    publish = [
        f"{JS_API}.STREAM.NAMES",
        f"{JS_API}.STREAM.INFO.{n.stream}",
        f"{JS_API}.CONSUMER.CREATE.{n.stream}",  # an ordered push consumer replaying the history
        f"{JS_API}.CONSUMER.INFO.{n.stream}.*",
        f"{JS_API}.STREAM.MSG.GET.{n.stream}",  # fleet/follow.py: a start time resolved to a sequence
        f"$JS.FC.{n.stream}.>",
        f"{JS_API}.STREAM.INFO.{n.jobs_stream}",  # the same over the jobs' membership and evidence
        f"{JS_API}.CONSUMER.CREATE.{n.jobs_stream}",
        f"{JS_API}.CONSUMER.INFO.{n.jobs_stream}.*",
        f"{JS_API}.STREAM.MSG.GET.{n.jobs_stream}",
        f"$JS.FC.{n.jobs_stream}.>",
        f"{JS_API}.STREAM.INFO.{n.signals_stream}",  # and over the straggler vectors (fleet/stragglers.py)
        f"{JS_API}.CONSUMER.CREATE.{n.signals_stream}",
        f"{JS_API}.CONSUMER.INFO.{n.signals_stream}.*",
        f"{JS_API}.STREAM.MSG.GET.{n.signals_stream}",
        f"$JS.FC.{n.signals_stream}.>",
        f"{INCIDENTS_PREFIX}.>",
        f"$KV.{n.incidents_bucket}.>",
        *_incidents_read(layout),
        # straggler records (fleet/stragglers.py)
        f"{STRAGGLERS_PREFIX}.>",
        f"$KV.{n.stragglers_bucket}.>",
        f"{JS_API}.STREAM.INFO.{_kv_stream(n.stragglers_bucket)}",
        # partition leases (fleet/leases.py): get, create, compare-and-set, delete of keys (the bucket: the admin's)
        f"$KV.{n.leases_bucket}.>",
        f"{JS_API}.STREAM.INFO.{_kv_stream(n.leases_bucket)}",
        f"{JS_API}.STREAM.MSG.GET.{_kv_stream(n.leases_bucket)}",
        f"{JS_API}.DIRECT.GET.{_kv_stream(n.leases_bucket)}.>",
        f"{BEACON_PREFIX}.*",  # the replicas' beats (core NATS), heard by every replica
    ]
    return Permissions(publish=publish, subscribe=[inbox("correlator"), f"{BEACON_PREFIX}.*"],
                       publish_deny=_durables_deny(layout))


def reader_permissions(layout: Layout) -> Permissions:
    """The dashboard, `top` (fleet.state.FleetFeed) and `events` (fleet.events): read, never write."""
    n = layout.names
    nodes = _kv_stream(n.nodes_bucket)
    publish = [
        f"{JS_API}.STREAM.NAMES",
        f"{JS_API}.STREAM.INFO.{n.stream}",
        f"{JS_API}.STREAM.INFO.{nodes}",
        f"{JS_API}.CONSUMER.CREATE.{n.stream}",    # ephemeral ordered push consumers (FleetFeed)
        f"{JS_API}.CONSUMER.CREATE.{n.stream}.>",  # named ephemeral pull consumers (events)
        f"{JS_API}.CONSUMER.INFO.{n.stream}.*",
        f"{JS_API}.CONSUMER.MSG.NEXT.{n.stream}.*",
        f"{JS_API}.STREAM.MSG.GET.{n.stream}",  # fleet/follow.py: a start time resolved to a sequence
        f"$JS.FC.{n.stream}.>",  # flow-control replies of ordered consumers
        f"{JS_API}.STREAM.INFO.{n.jobs_stream}",   # jobs' membership and evidence, read the same way
        f"{JS_API}.CONSUMER.CREATE.{n.jobs_stream}",
        f"{JS_API}.CONSUMER.CREATE.{n.jobs_stream}.>",
        f"{JS_API}.CONSUMER.INFO.{n.jobs_stream}.*",
        f"{JS_API}.CONSUMER.MSG.NEXT.{n.jobs_stream}.*",
        f"$JS.FC.{n.jobs_stream}.>",
        f"{JS_API}.STREAM.INFO.{n.signals_stream}",
        f"{JS_API}.CONSUMER.CREATE.{n.signals_stream}",
        f"{JS_API}.CONSUMER.CREATE.{n.signals_stream}.>",
        f"{JS_API}.CONSUMER.INFO.{n.signals_stream}.*",
        f"{JS_API}.CONSUMER.MSG.NEXT.{n.signals_stream}.*",
        f"$JS.FC.{n.signals_stream}.>",
        f"{JS_API}.CONSUMER.CREATE.{nodes}",       # the KV watch
        f"{JS_API}.CONSUMER.INFO.{nodes}.*",
        f"$JS.FC.{nodes}.>",
        f"{JS_API}.STREAM.INFO.{_kv_stream(n.stragglers_bucket)}",  # straggler records: watch, get
        f"{JS_API}.CONSUMER.CREATE.{_kv_stream(n.stragglers_bucket)}",
        f"{JS_API}.CONSUMER.INFO.{_kv_stream(n.stragglers_bucket)}.*",
        f"$JS.FC.{_kv_stream(n.stragglers_bucket)}.>",
        f"{JS_API}.DIRECT.GET.{_kv_stream(n.stragglers_bucket)}.>",
        # the incidents views: a watch of the bucket
        *_incidents_read(layout),
    ]
    return Permissions(publish=publish, subscribe=[f"{HEARTBEAT_PREFIX}.>", inbox("reader")],
                       publish_deny=_durables_deny(layout))


def _durables_deny(layout: Layout) -> list[str]:
    """CONSUMER.CREATE.<stream>.<name> creates *or updates* a consumer by that name: without this a reader
    could repoint the cordoner's durable consumer at itself, or narrow the exporter's filter so that
    what it should forward is never delivered to it."""
    n = layout.names
    return [f"{JS_API}.CONSUMER.CREATE.{n.stream}.{d}{tail}"
            for d in (n.cordoner_durable, n.export_durable, n.otlp_durable) for tail in ("", ".>")]


def exporter_permissions(layout: Layout) -> Permissions:
    """fleet.exporter: a durable pull consumer on the events stream per export format (CloudEvents, OTLP),
    acknowledged after the receiver's 2xx."""
    n = layout.names
    publish = [f"{JS_API}.STREAM.NAMES", f"{JS_API}.STREAM.INFO.{n.stream}"]  # ensure_stream: verified, never created
    for d in (n.export_durable, n.otlp_durable):
        publish += [
            f"{JS_API}.CONSUMER.DURABLE.CREATE.{n.stream}.{d}",
            f"{JS_API}.CONSUMER.CREATE.{n.stream}.{d}",
            f"{JS_API}.CONSUMER.CREATE.{n.stream}.{d}.>",
            f"{JS_API}.CONSUMER.INFO.{n.stream}.{d}",
            f"{JS_API}.CONSUMER.MSG.NEXT.{n.stream}.{d}",
            f"$JS.ACK.{n.stream}.{d}.>",  # ack/term/progress of its own durables' deliveries only
        ]
    return Permissions(publish=publish, subscribe=[inbox("exporter")])


def _q(s: str) -> str:
    return json.dumps(s)  # nats-server accepts JSON strings; quoting keeps '$' from being a variable


def _user(key: str, comment: str, perms: Permissions | None, indent: str) -> list[str]:
    lines = [f"{indent}# {comment}"]
    if perms is None:
        return [*lines, f"{indent}{{nkey: {_q(key)}}}"]
    pub = f"allow: [{', '.join(map(_q, perms.publish))}]"
    if perms.publish_deny:
        pub += f", deny: [{', '.join(map(_q, perms.publish_deny))}]"
    lines.append(f"{indent}{{nkey: {_q(key)}, permissions: {{")
    lines.append(f"{indent}  publish: {{{pub}}}")
    lines.append(f"{indent}  subscribe: {{allow: [{', '.join(map(_q, perms.subscribe))}]}}")
    lines.append(f"{indent}}}}}")
    return lines


def render_accounts(layout: Layout) -> str:
    """The ``accounts`` block alone, for ``include`` in an existing server's config."""
    check_layout(layout)
    ind = "      "
    users: list[str] = []
    for name in sorted(layout.nodes, key=encode_token):
        users += _user(layout.nodes[name], f"node {name} (token {encode_token(name)})",
                       node_permissions(name, layout), ind)
    cordoner, reader = cordoner_permissions(layout), reader_permissions(layout)
    for keys, comment, perms in ((layout.roles.cordoner, "cordoner", cordoner),
                                 (layout.roles.correlators, "correlator (incidents)", correlator_permissions(layout)),
                                 (layout.roles.readers, "reader (dashboard, top, events)", reader),
                                 (layout.roles.exporters, "exporter (CloudEvents, OTLP)", exporter_permissions(layout)),
                                 (layout.roles.admins, "admin (streams, buckets, budget reset)", None)):
        users += [line for k in keys for line in _user(k, comment, perms, ind)]
    return "\n".join([
        "accounts {",
        f"  {layout.names.account}: {{",
        "    jetstream: enabled",
        "    users: [",
        *users,
        "    ]",
        "  }",
        "}",
    ]) + "\n"


def render_config(layout: Layout, *, source: str = "") -> str:
    s = layout.server
    head = ["# Generated by fleet/nats_permissions.py" + (f" from {source}" if source else "") + ": do not edit;",
            "# change the layout and render again (docs/nats-security.md).",
            f"server_name: {_q(s.server_name)}",
            f"listen: {_q(s.listen)}",
            "jetstream {",
            f"  store_dir: {_q(s.store_dir)}",
            "}"]
    if s.tls_cert:
        head += ["tls {", f"  cert_file: {_q(s.tls_cert)}", f"  key_file: {_q(s.tls_key)}"]
        if s.tls_ca:
            head += [f"  ca_file: {_q(s.tls_ca)}", "  verify: true"]
        head.append("}")
    return "\n".join(head) + "\n" + render_accounts(layout)


def new_user_seed() -> tuple[str, str]:
    """(seed, public key) of a fresh user nkey."""
    import nkeys  # type: ignore[import-untyped]

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    kp = nkeys.from_seed(bytearray(seed))
    try:
        return seed.decode(), kp.public_key.decode()
    finally:
        kp.wipe()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fleet.nats_permissions", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="print the nats-server config for a layout")
    r.add_argument("layout")
    r.add_argument("--accounts-only", action="store_true", help="only the accounts block, for `include`")
    k = sub.add_parser("keygen", help="write a new user nkey seed file and print its public key")
    k.add_argument("seed_file")
    args = p.parse_args(argv)
    if args.command == "keygen":
        seed, public = new_user_seed()
        fd = os.open(args.seed_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never overwrite a key
        with os.fdopen(fd, "w") as fh:
            fh.write(seed + "\n")
        print(public)
        return 0
    try:
        layout = load_layout(args.layout)
    except (OSError, ValueError) as exc:
        print(f"nats_permissions: {exc}", file=sys.stderr)
        return 78  # EX_CONFIG, as the agent's own config errors
    sys.stdout.write(render_accounts(layout) if args.accounts_only else render_config(layout, source=args.layout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
