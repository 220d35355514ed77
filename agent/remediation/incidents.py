"""What remediation knows of the fleet correlator's incidents: never cordon a victim for its job's symptoms.

The correlator (fleet/incidents.py) keeps each job's current incident in the KV bucket
``gna-incidents``. Whoever decides a cordon -- the central cordoner, or a node agent that runs its
own remediations (per-node mode) -- watches the bucket: a node that is a victim of an open incident
is never cordoned for that job's NCCL symptoms (audited as skipped, with the culprit), and a job's
first NCCL message that a rule would cordon on waits up to ``GRACE`` seconds for the verdict, once
per job, so the correlator speaks first. Records are validated like any input from the wire.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import structlog

log = structlog.get_logger(__name__)

INCIDENTS_BUCKET = "gna-incidents"  # key: the job's token, value: its current incident record
GRACE = 3.0  # s: a job's first NCCL message that would cordon waits this long for the correlator's verdict
MAX_JOBS = 100_000


def parse_incident(data: bytes) -> dict[str, Any] | None:
    """An incident record, or None when it is not one (counted by the caller)."""
    try:
        rec = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    ok = (isinstance(rec, dict) and isinstance(rec.get("job"), str) and rec.get("status") in ("open", "resolved")
          and isinstance(rec.get("victims", []), list)
          and (rec.get("culprit") is None or (isinstance(rec["culprit"], dict)
                                              and isinstance(rec["culprit"].get("node"), str))))
    return rec if ok else None


def job_of(msg: dict[str, Any]) -> str | None:
    details = msg.get("details")
    job = details.get("job") if isinstance(details, dict) and msg.get("collector") == "nccl_logs" else None
    return job if isinstance(job, str) and job else None


class IncidentView:
    """The open incidents, by job, as the bucket says."""

    def __init__(self, *, grace: float = GRACE) -> None:
        self.incidents: dict[str, dict[str, Any]] = {}
        self.job_first_seen: dict[str, float] = {}
        self.grace = grace
        self.invalid = 0

    def file(self, data: bytes) -> dict[str, Any] | None:
        rec = parse_incident(data)
        if rec is None:
            self.invalid += 1
            return None
        if rec["job"] not in self.incidents and len(self.incidents) >= MAX_JOBS:
            self.incidents.pop(next(iter(self.incidents)))
        self.incidents[rec["job"]] = rec
        return rec

    def spare(self, msg: dict[str, Any]) -> str | None:
        """Why this message must not cordon its node: the node is a victim of an open incident and the
        message is that job's NCCL symptom."""
        job = job_of(msg)
        inc = self.incidents.get(job) if job else None
        if inc is None or inc.get("status") != "open" or msg.get("node") not in inc.get("victims", []):
            return None
        c = inc.get("culprit") or {}
        who = f"{c.get('node')} {c.get('entity')}" if c else "not yet named"
        return f"victim of incident {job} (culprit {who}): its symptoms never cordon it"

    async def await_verdict(self, msg: dict[str, Any], would_cordon: bool) -> None:
        """A job's first NCCL message that would cordon its node waits (once per job, at most ``grace``
        s) for the correlator's verdict. Only those: the rest never wait."""
        job = job_of(msg)
        if job is None or job in self.incidents or not would_cordon:
            return
        first = self.job_first_seen.setdefault(job, time.monotonic())
        if len(self.job_first_seen) > MAX_JOBS:
            self.job_first_seen.clear()
        while job not in self.incidents and time.monotonic() - first < self.grace:
            await asyncio.sleep(0.05)

    async def watch(self, js: Any) -> None:
        """Follow the bucket for ever (retrying while it does not exist yet or NATS is away)."""
        while True:
            try:
                kv = await js.key_value(INCIDENTS_BUCKET)
                watcher = await kv.watchall()
                async for entry in watcher:
                    if entry is not None and entry.value:
                        self.file(entry.value)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("incident_watch_retry", error=repr(exc))
                await asyncio.sleep(1)
