"""Reason words a node writes and the fleet keys on, declared once."""

from __future__ import annotations

# NCCL RAS's verdicts on a process, strongest first (collectors/nccl/ras_protocol.py RasSuspect.reason, read from
# NCCL src/ras/client_support.cc's "dead", "unresponsive" and missing-process sections, its per-rank
# errors and status lines, and the collective progress comparison)
RAS_SUSPECT_REASONS = ("dead", "unresponsive", "missing", "error", "status", "behind", "remote_error")
# those that name a culprit on their own (the rest say where to look)
RAS_CULPRIT_REASONS = RAS_SUSPECT_REASONS[:4]
