"""Issue 26 (5): every NCCL rule has met real text (tests/corpus/nccl/*/input.log, copied from public logs),
and has met a real healthy input without a word (tests/test_corpus.py: a healthy case fires nothing of
warning or critical severity, whatever its type).

Allow-lists below are explicit and only shrink: an entry whose rule has since met a real input fails the
test until it is removed. Inputs are never written here to fill them: a rule waits for a real log.
"""

from __future__ import annotations

import json
from pathlib import Path

from collectors.nccl.line import parse_line
from collectors.nccl.matching import Match, match_or_reject
from collectors.nccl.rules import RULES, WARNING_RULE

CORPUS = Path(__file__).parent / "corpus" / "nccl"
CASES = sorted(p for p in CORPUS.glob("*") if (p / "expect.json").is_file())

# Rules no real input in the corpus exercises yet (each waits for a public log that prints its line):
NO_REAL_INPUT: frozenset[str] = frozenset({
    "pg_periodic",  # glog INFO "NCCL Work update periodically" (TORCH_DISTRIBUTED_DEBUG runs); no public excerpt yet
})

# Rules whose line is a finding by itself (a failure, a timeout, a fallback's cause, a WARN): they are silent
# on a healthy input by never matching one of its lines (checked below on every healthy case).
FINDING_LINES: frozenset[str] = frozenset({
    "ib_no_device", "ib_no_verbs", "gdr", "channel_shm", "ib_completion", "ib_async", "socket_error",
    "watchdog", "heartbeat", "pg_progress", "pg_dump_signal", "warn",
})

# Rules that read healthy runs too but no healthy real input holds their line yet (shrinks as cases come):
NO_HEALTHY_INPUT: frozenset[str] = frozenset({
    "socket_using",  # "NET/Socket : Using [0]eth0" (bootstrap interface, printed beside IB too)
    "init",  # "comm 0x... rank r nranks n ... Init COMPLETE"
    "env_hca",  # "NCCL_IB_HCA set by environment to ..."
    "pg_periodic",
})


def _read() -> tuple[dict[str, set[str]], dict[str, set[str]], list[str]]:
    """rule -> cases whose input it matches (all, healthy ones), and the healthy cases."""
    seen: dict[str, set[str]] = {}
    seen_healthy: dict[str, set[str]] = {}
    healthy: list[str] = []
    for case in CASES:
        quiet = not json.loads((case / "expect.json").read_text()).get("must")
        if quiet:
            healthy.append(case.name)
        for raw in (case / "input.log").read_bytes().splitlines():
            m = match_or_reject(parse_line(0, raw))
            if isinstance(m, Match):
                seen.setdefault(m.rule.name, set()).add(case.name)
                if quiet:
                    seen_healthy.setdefault(m.rule.name, set()).add(case.name)
    return seen, seen_healthy, healthy


SEEN, SEEN_HEALTHY, HEALTHY = _read()
NAMES = {r.name for r in (*RULES, WARNING_RULE)}


def test_the_allow_lists_name_registered_rules() -> None:
    assert NO_REAL_INPUT <= NAMES and FINDING_LINES <= NAMES and NO_HEALTHY_INPUT <= NAMES
    assert not FINDING_LINES & NO_HEALTHY_INPUT


def test_every_rule_is_exercised_by_a_real_input() -> None:
    missing = sorted(NAMES - set(SEEN) - NO_REAL_INPUT)
    assert not missing, f"rules no real corpus input exercises: {missing} (add a real public log, or list them)"
    found = sorted(NO_REAL_INPUT & set(SEEN))
    assert not found, f"now exercised by {[sorted(SEEN[n]) for n in found]}: remove {found} from NO_REAL_INPUT"


def test_every_rule_stays_silent_on_a_real_healthy_input() -> None:
    assert len(HEALTHY) >= 5, HEALTHY
    loud = {n: sorted(SEEN_HEALTHY[n]) for n in FINDING_LINES if n in SEEN_HEALTHY}
    assert not loud, f"a finding's line in a healthy case (a false positive, or the case is not healthy): {loud}"
    reading = NAMES - FINDING_LINES - NO_HEALTHY_INPUT
    missing = sorted(n for n in reading if n not in SEEN_HEALTHY)
    assert not missing, f"rules that read healthy runs yet met no healthy real input: {missing}"
    found = sorted(n for n in NO_HEALTHY_INPUT if n in SEEN_HEALTHY)
    assert not found, f"now read on a healthy input: remove {found} from NO_HEALTHY_INPUT"
