"""Run ``gpu-node-agent diagnose`` over a generated scenario and judge its answer against expected.json.

Shared by tests/layouts/test_layouts.py and bench/layouts.py. Only the CLI's documented JSON is read
(docs/correlator.md, "Offline": ``{"nodes", "node_status", "critical": {node: [messages]}, "incidents": [...]}``,
an incident's ``culprit`` ``{"node", "entity", "kind", ...}`` or null and its ``culprits``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HARDWARE_PREFIXES = ("gpu:", "ib:", "nvswitch:", "module:")


def diagnose_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("gpu-node-agent")
    if exe.exists():
        return [str(exe), "diagnose"]
    venv = ROOT / ".venv/bin/gpu-node-agent"
    if venv.exists():
        return [str(venv), "diagnose"]
    return [sys.executable, "-m", "agent", "diagnose"]


def run_diagnose(expected: dict[str, Any], timeout: float = 600) -> tuple[int, dict[str, Any], str]:
    """(exit status, parsed JSON or {}, stderr)."""
    cmd = diagnose_cmd()
    for root in expected["roots"]:
        cmd += ["--host-root", root]
    cmd += ["--config", expected["config"], "--format", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    try:
        out = json.loads(p.stdout) if p.stdout.strip() else {}
    except json.JSONDecodeError:
        out = {}
    return p.returncode, out, p.stderr


@dataclass
class Judgement:
    layout: str
    fault: str
    seed: int
    expected_node: str | None
    expected_kind: str | None
    named: list[str] = field(default_factory=list)  # every node named as a culprit, in any incident
    named_times: int = 0  # culprit namings in all (incident, culprit) pairs
    named_right: int = 0
    wrong: list[str] = field(default_factory=list)  # named, and another node (or nothing this job ran on)
    aliases: list[str] = field(default_factory=list)  # named: the culprit's pod or host name, not its node name
    kind: str | None = None  # the kind the expected node was named with
    incidents: int = 0
    misattributed: list[str] = field(default_factory=list)  # "node: type entity (about other)"
    healthy_flagged: list[str] = field(default_factory=list)  # healthy nodes with a hardware critical
    summary: list[str] = field(default_factory=list)
    rc: int = 0
    error: str = ""

    @property
    def right(self) -> bool:
        return self.expected_node is not None and self.expected_node in self.named

    @property
    def as_expected(self) -> bool:
        if self.error:
            return False
        if self.expected_node is None:
            return self.incidents == 0 and not self.misattributed and not self.healthy_flagged
        return self.right and not self.wrong and not self.aliases and not self.misattributed and not self.healthy_flagged

    @property
    def outcome(self) -> str:
        if self.error:
            return "error"
        if self.as_expected:
            return "ok"
        if self.wrong:
            return "wrong-node"
        if self.aliases and not self.right:
            return "pod-not-node"
        if self.expected_node is None:
            return "false-alarm"
        if not self.right:
            return "no-verdict"
        return "misattributed"

    def explain(self) -> str:
        lines = [f"{self.layout}/{self.fault} seed {self.seed}: expected {self.expected_node or 'no incident'}"
                 f" ({self.expected_kind}), named {self.named or 'nobody'}; outcome {self.outcome}"]
        lines += [f"  incident: {s}" for s in self.summary]
        lines += [f"  named {a!r}: the culprit's pod/host name, not the node's" for a in self.aliases]
        lines += [f"  misattributed critical: {m}" for m in self.misattributed]
        lines += [f"  healthy node flagged: {m}" for m in self.healthy_flagged]
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)


def _subject_host(msg: dict[str, Any]) -> str | None:
    details = msg.get("details") or {}
    host = details.get("host") if isinstance(details, dict) else None
    if isinstance(host, str) and host:
        return host
    ent = msg.get("entity") or ""
    if ent.startswith("nccl:"):
        parts = ent.split(":")
        if len(parts) >= 3:
            return parts[1]
    return None


def judge(expected: dict[str, Any], rc: int, out: dict[str, Any], stderr: str = "") -> Judgement:
    j = Judgement(layout=expected["layout"], fault=expected["fault"], seed=expected["seed"],
                  expected_node=expected["culprit_node"], expected_kind=expected["culprit_entity_kind"], rc=rc)
    if rc not in (0, 2) or "incidents" not in out:
        j.error = f"diagnose exit {rc}: {stderr.strip()[-400:]}"
        return j
    hosts: dict[str, str] = expected["hosts"]
    named: list[str] = []
    for inc in out.get("incidents") or []:
        j.incidents += 1
        culprits = [c for c in (inc.get("culprits") or []) if isinstance(c, dict)]
        c0 = inc.get("culprit")
        if isinstance(c0, dict) and not any(c.get("node") == c0.get("node") for c in culprits):
            culprits.insert(0, c0)
        for c in culprits:
            node = str(c.get("node"))
            j.named_times += 1
            if node == j.expected_node:
                j.named_right += 1
                j.kind = j.kind or c.get("kind")
            named.append(node)
        j.summary.append(f"job {inc.get('job')}: culprit {[(c.get('node'), c.get('entity'), c.get('kind')) for c in culprits] or None}"
                         f" confidence {inc.get('confidence')}: {inc.get('reason')}")
    j.named = sorted(set(named))
    j.aliases = [n for n in j.named if n != j.expected_node and j.expected_node and hosts.get(n) == j.expected_node]
    j.wrong = [n for n in j.named if n != j.expected_node and n not in j.aliases]
    for node, msgs in (out.get("critical") or {}).items():
        for m in msgs if isinstance(msgs, list) else []:
            ent = str(m.get("entity") or "")
            typ = str(m.get("type") or "")
            subject = _subject_host(m)
            about = hosts.get(subject) if subject else None
            if subject and about and about != node:
                j.misattributed.append(f"{node}: {typ} {ent} (about {about})")
            elif subject and not about and subject != node:
                j.misattributed.append(f"{node}: {typ} {ent} (about unknown host {subject!r})")
            elif j.expected_node is None or (ent.startswith(HARDWARE_PREFIXES) and node != j.expected_node):
                j.healthy_flagged.append(f"{node}: {typ} {ent}")
    j.misattributed = sorted(set(j.misattributed))
    j.healthy_flagged = sorted(set(j.healthy_flagged))
    return j
