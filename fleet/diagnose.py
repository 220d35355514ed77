"""``gpu-node-agent diagnose``: what the offline correlation of node snapshots tells an operator.

Each host root's one-shot checks (agent/check.py) and the fleet correlator over all of them
(fleet/correlator.py). The text names every node's critical findings, inside an incident or not (a GPU
that fell off the bus on an idle node is no job's culprit, and still the one thing to fix), then each
incident with its evidence: the items that decided it first, the count of what is left out. Times
are when each node's check read the evidence, said as such: the messages carry no log's own time.
"""

from __future__ import annotations

from typing import Any

from gna_sdk import plural

EVIDENCE_LINES = 8  # evidence lines printed per incident (the decisive ones always; the rest counted)
VICTIMS_SHOWN = 16


def summary(reports: list[dict[str, Any]], incidents: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON document: nodes with their status and critical findings, and the incidents."""
    return {"nodes": [r["node"] for r in reports],
            "node_status": {r["node"]: r["status"] for r in reports},
            "critical": {r["node"]: _critical(r) for r in reports if _critical(r)},
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
        lines.append(f"  evidence: {len(shown)} of {total} shown (read at; --format json has the "
                     f"{len(evidence)} kept, with counts per type and node)")
        for e in shown:
            mark = "  <- decided it" if e.get("decisive") else ""
            lines.append(f"    {e.get('time')} {e['node']} {e['type']} {e['entity']}{mark}")
        if total > len(shown):
            lines.append(f"    ... {total - len(shown)} more")
    return "\n".join(lines)
