"""``gpu-node-agent diagnose``: what the offline correlation of node snapshots tells an operator.

Each node's one-shot checks (agent/check.py) and the fleet correlator over all of them
(fleet/correlator.py). A node's snapshot is either its host root (a simulated node, a kept demo, a
mounted copy: ``--host-root``) or, from a live node, what ``gpu-node-agent check --format json``
printed there (``--report``): every message check made, the very ones diagnose would make from the
root. A report is untrusted input: read bounded, each message decoded as the fleet decodes the wire
(fleet/wire.py, on the subject the node would have published it on: a message naming another node
is refused), the refusals counted and said.

The text names every node's critical findings, inside an incident or not (a GPU that fell off the bus on
an idle node is no job's culprit, and still the one thing to fix), then each incident with its evidence:
the items shown in time order (those that decided it always among them, marked), the count of what is left
out. An item's time is the time its source stated where the message carries that (``logged_at``: the kernel
log's records, a training log line's own stamp or its container runtime's record time), else when the node's
check read it, said as such ("(read ...)"); the items are ordered by that time, whichever it is.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from fleet.typed_details import TYPED
from fleet.wire import Rejected, decode_event, decode_job
from gna_sdk import node_status, plural
from gna_types.policy import verdict
from gna_types.subjects import subjects_for

MAX_REPORT_BYTES = 64 << 20  # one node's check report (a node with a storm of findings stays far below)
MAX_REPORT_MESSAGES = 100_000
MAX_HOSTNAMES = 1024  # names a node's processes print (agent/check.py)

EVIDENCE_LINES = 8  # evidence lines printed per incident (the decisive ones always; the rest counted)
VICTIMS_SHOWN = 16


def summary(reports: list[dict[str, Any]], incidents: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON document: nodes with their status and critical findings, and the incidents."""
    return {"nodes": [r["node"] for r in reports],
            "node_status": {r["node"]: r["status"] for r in reports},
            "critical": {r["node"]: crit for r in reports if (crit := _critical(r))},
            "incidents": incidents}


def _critical(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in report["conditions"] + report["events"] if m.get("severity") == "critical"]


def _in_incident(m: dict[str, Any], incidents: list[dict[str, Any]]) -> str | None:
    for inc in incidents:
        for c in inc.get("culprits") or ([inc["culprit"]] if inc.get("culprit") else []):
            if c.get("node") == m.get("node") and c.get("entity") == m.get("entity"):
                return str(inc["job"])
    return None


def render_text(reports: list[dict[str, Any]], incidents: list[dict[str, Any]]) -> str:
    by_status: dict[str, int] = {}
    for r in reports:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    counts = ", ".join(f"{by_status[s]} {s}" for s in ("unhealthy", "degraded", "healthy") if by_status.get(s))
    lines = [f"{plural(len(reports), 'node')} ({counts}), {plural(len(incidents), 'incident')}"]
    for r in sorted(reports, key=lambda r: r["node"]):
        crit = _critical(r)
        if not crit:
            continue
        lines.append(f"node {r['node']}: {r['status'].upper()}")
        for m in crit:
            job = _in_incident(m, incidents)
            where = f" (culprit of job {job})" if job else ""
            lines.append(f"  [critical] {m['type']} {m['entity']}{where}: {m.get('message', '')}")
    for inc in incidents:
        c = inc["culprit"]
        who = f"{c['node']} {c['entity']} ({c['kind']})" if c else "no single culprit"
        lines.append(f"job {inc['job']}: culprit {who}, confidence {inc['confidence']}: {inc['reason']}")
        victims = inc["victims"]
        more = f" and {len(victims) - VICTIMS_SHOWN} more" if len(victims) > VICTIMS_SHOWN else ""
        lines.append(f"  victims ({len(victims)}): {', '.join(victims[:VICTIMS_SHOWN])}{more}")
        evidence = inc["evidence"]
        decisive = [e for e in evidence if e.get("decisive")]
        shown = decisive + [e for e in evidence if not e.get("decisive")][:max(0, EVIDENCE_LINES - len(decisive))]
        total = max(int(inc.get("evidence_total") or 0), len(evidence))
        lines.append(f"  evidence: {len(shown)} of {total} shown in time order (when logged, else when check read "
                     f"it; --format json has the {len(evidence)} kept, with counts per type and node)")
        for e in sorted(shown, key=_when_key):
            mark = "  <- decided it" if e.get("decisive") else ""
            stated = e.get("logged_at")
            when = stated if isinstance(stated, str) and stated else f"(read {e.get('time')})"
            lines.append(f"    {when} {e['node']} {e['type']} {e['entity']}{mark}")
        if total > len(shown):
            lines.append(f"    ... {total - len(shown)} more")
    return "\n".join(lines)


def _instant(value: Any) -> float | None:
    """Epoch seconds of an RFC 3339 time (any zone, any fraction), None for anything else."""
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    try:
        t = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    return (t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)).timestamp()


def _when_key(e: dict[str, Any]) -> tuple[int, float]:
    """An evidence item's place in time: its stated time (``logged_at``) where it has one, else when check
    read it; an item with neither, after all that have one (the sort is stable: their order is kept)."""
    t = _instant(e.get("logged_at"))
    if t is None:
        t = _instant(e.get("time"))
    return (0, t) if t is not None else (1, 0.0)


def join_relayed(reports: list[dict[str, Any]]) -> dict[str, int]:
    """Each host's lines join that host's snapshot; lines several snapshots read are kept once.

    A node relays the lines of other hosts' processes it read in a job-wide file (srun's forwarded output on the
    batch host, a launcher's aggregated log: ``relayed`` in the details). Offline, the operator gathered the
    snapshots: a relayed line whose host is one of them (the NCCL hostname that snapshot's own processes print,
    or the snapshot's name) becomes that snapshot's, graded as the policy grades it, ``relayed_by`` kept; one
    whose host is none of them stays the reader's word. A line read from a file several snapshots hold (a
    shared filesystem) is kept once (by its node, type, entity, reason, file offset and text). Changes
    ``reports`` in place; returns what it did, counted."""
    hosts: dict[str, str] = {}
    for r in reports:
        hosts.setdefault(str(r["node"]).split(".")[0], r["node"])
        for name in r.get("hostnames") or ():  # the names its processes print: its own, its pods' (check's word)
            hosts.setdefault(name, r["node"])
        for m in r["events"] + r["conditions"]:
            d = m.get("details")
            if m.get("collector") == "nccl_logs" and isinstance(d, dict) and not d.get("relayed") \
                    and isinstance(d.get("host"), str):
                hosts.setdefault(d["host"], r["node"])
    by_node = {r["node"]: r for r in reports}
    counts = {"joined": 0, "duplicates": 0, "kept_relayed": 0}
    seen: set[tuple[str, ...]] = set()
    moved: list[tuple[str, dict[str, Any]]] = []
    for r in reports:
        kept = []
        for m in r["events"]:
            d = m.get("details")
            if m.get("collector") != "nccl_logs" or not isinstance(d, dict):
                kept.append(m)
                continue
            target = hosts.get(str(d.get("host"))) if d.get("relayed") else None
            if target is not None:
                m = {k: v for k, v in m.items() if k != TYPED}
                m.update(node=target, relayed_by=r["node"], details={**d, "relayed": False},
                         severity=verdict(str(m.get("type")), str(m.get("reason"))).severity)
            key = tuple(str(x)[:2000] for x in (m.get("node"), m.get("type"), m.get("entity"), m.get("reason"),
                                                 d.get("offset"), d.get("line")))
            if key in seen:
                counts["duplicates"] += 1
                continue
            seen.add(key)
            if target is not None:
                counts["joined"] += 1
                moved.append((target, m))
            else:
                counts["kept_relayed"] += bool(d.get("relayed"))
                kept.append(m)
        r["events"] = kept
    for target, m in moved:
        by_node[target]["events"].append(m)
    for r in reports:  # the status is the messages', as a report's is
        r["status"] = node_status(r["conditions"] + r["events"])
    return counts


class ReportError(ValueError):
    """A report that cannot be used at all (unreadable, not JSON, not a check report)."""


def load_report(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """One node's ``check --format json`` output as diagnose uses it, and its refused messages by reason."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_REPORT_BYTES + 1)
    except OSError as exc:
        raise ReportError(f"{path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(f"{path}: larger than {MAX_REPORT_BYTES >> 20} MiB")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ReportError(f"{path}: not JSON ({str(exc)[:120]})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("node"), str) or not doc["node"] or not all(
            isinstance(doc.get(k), list) for k in ("conditions", "events")):
        raise ReportError(f"{path}: not a report of 'gpu-node-agent check --format json' (node, conditions, events)")
    node = doc["node"]
    names = doc.get("hostnames")
    hostnames = sorted({n for n in names[:MAX_HOSTNAMES] if isinstance(n, str) and 0 < len(n) <= 253}) \
        if isinstance(names, list) else []
    refused: dict[str, int] = {}
    kept: dict[str, list[dict[str, Any]]] = {"conditions": [], "events": []}
    for part in ("conditions", "events"):
        for m in doc[part][:MAX_REPORT_MESSAGES]:
            try:
                if not isinstance(m, dict):
                    raise Rejected("not_an_object", type(m).__name__)
                subject = subjects_for(node, str(m.get("collector")), str(m.get("severity")), str(m.get("type")),
                                       m.get("details"))[0]
                raw = json.dumps(m).encode()
                msg = decode_job(subject, raw) if subject.startswith("gna.jobs.") else decode_event(subject, raw)
            except Rejected as exc:
                refused[exc.reason] = refused.get(exc.reason, 0) + 1
                continue
            except (ValueError, TypeError):
                refused["schema"] = refused.get("schema", 0) + 1
                continue
            kept[part].append(msg)
        if len(doc[part]) > MAX_REPORT_MESSAGES:
            refused["too_many"] = refused.get("too_many", 0) + len(doc[part]) - MAX_REPORT_MESSAGES
    # the status is the messages', not the report's word
    status = node_status(kept["conditions"] + kept["events"])
    return {"node": node, "status": status, "hostnames": hostnames, **kept}, refused
