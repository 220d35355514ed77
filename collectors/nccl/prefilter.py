"""Which lines are decoded at all: a byte scan for the rules' needles, in C, before any decoding.

Only lines containing one of the needles are decoded. Channel lines over P2P/SHM-free paths (the numerous
intra-node ones) never pass; every NET channel line does: which NIC each channel uses (NET/IB/<n>) is the
rank's real NIC, GDRDMA or not (a few hundred lines per job start; those alike are counted, not decoded:
repeats.py, which ``hits`` serves). The needles are the union of the rules'
own (rules/*.py), so a rule brings its own (tests/test_nccl_formats.py: every golden line a rule matches
holds one of its needles), and the markers of a crashed rank's multi-line reports (crash_evidence.py: a chunk
holding one is read line by line); bench/nccl_ingest.py's ``grep -cE`` pattern is built from the same list.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from collectors.nccl import libhs
from collectors.nccl.crash_evidence import MARKERS
from collectors.nccl.rule import Rule
from collectors.nccl.rules import RULES, WARNING_RULE

# any WARN line is an NCCLWarning (WARNING_RULE), whatever rule it also matches
NEEDLES: tuple[bytes, ...] = tuple(dict.fromkeys([*(n for r in (*RULES, WARNING_RULE) for n in r.needles), *MARKERS]))
PREFILTER = re.compile(b"|".join(re.escape(n) for n in NEEDLES))
# Rules whose repeated lines are tallied, not decoded (Rule.repeat, collectors/nccl/repeats.py): a hit of one of
# their needles carries the rule's kind (1 + its index here), any other needle's kind 0. ``hits`` packs a hit as
# ``end << KIND_BITS | kind``.
REPEATING: tuple[Rule, ...] = tuple(r for r in RULES if r.repeat is not None)
KIND_BITS = 3
assert len(REPEATING) < 1 << KIND_BITS
NEEDLE_KIND: dict[bytes, int] = {n: next((i + 1 for i, r in enumerate(REPEATING) if n in r.needles), 0)
                                 for n in NEEDLES}


def grep_pattern() -> str:
    """The prefilter's needles as one POSIX extended regular expression (bench/nccl_ingest.py's ``grep -cE``)."""
    return "|".join(re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", n.decode()) for n in NEEDLES)


class _Wheel:
    """The python-hyperscan wheel's database, with a scratch space per thread (a scratch serves one scan at a time,
    and a scan lets go of the GIL)."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.local = threading.local()

    def info(self) -> str:
        return f"python-hyperscan wheel, {self.db.info().decode(errors='replace')}"

    def hits(self, data: bytes, shift: int) -> list[int]:
        scratch = getattr(self.local, "scratch", None)
        if scratch is None:
            scratch = self.local.scratch = self.db.scratch.clone()
        out: list[int] = []
        add = out.append
        self.db.scan(data, match_event_handler=lambda id_, _frm, to, _fl, _ctx: add(to << shift | id_),
                     scratch=scratch)
        out.sort()  # in the order of their ends but for ties: a linear pass
        return out


def _hyperscan(system: bool = True) -> Any:
    """Hyperscan's SIMD literal matcher (x86_64): the system's library where it loads (libhs.py: built for every
    instruction set, the CPU's best used), else (or with ``system`` False) the python-hyperscan wheel; None where
    neither is installed. An expression's id is its needle's kind (ids need not be unique): ``hits`` learns it
    from the match itself."""
    exprs = [re.escape(n) for n in NEEDLES]
    ids = [NEEDLE_KIND[n] for n in NEEDLES]
    found = libhs.compile_literals(exprs, ids) if system else None
    if found is not None:
        return found
    try:
        import hyperscan
    except ImportError:
        return None
    db = hyperscan.Database()
    db.compile(expressions=exprs, ids=ids, elements=len(exprs), flags=[0] * len(exprs))
    return _Wheel(db)


def _re2() -> Any:
    """google-re2's DFA over the alternation: ~4x Python's backtracking re on this input."""
    try:
        import re2
    except ImportError:
        return None
    return re2.compile(b"|".join(re.escape(n) for n in NEEDLES))


_ENGINES: dict[str, Any] = {}
_BUILD = threading.Lock()
_UNBUILT = object()


def engine(name: str) -> Any:
    """The compiled scanner, built on first use: an idle node with no NCCL logs never loads it. "hyperscan": the
    system library's or the wheel's, "hyperscan-wheel": the wheel's (tests and bench/nccl_ingest.py compare them)."""
    got = _ENGINES.get(name, _UNBUILT)
    if got is _UNBUILT:
        with _BUILD:  # once, whichever thread scans first
            if name not in _ENGINES:
                _ENGINES[name] = (_hyperscan() if name == "hyperscan" else _hyperscan(system=False)
                                  if name == "hyperscan-wheel" else _re2() if name == "re2" else PREFILTER)
            got = _ENGINES[name]
    return got


def best_engine() -> str:
    for name in ("hyperscan", "re2"):
        if engine(name) is not None:
            return name
    return "re"


def hits(data: bytes, name: str) -> list[int]:
    """Every needle match, ascending: ``end << KIND_BITS | kind`` (``end`` just past the match; ``kind`` that of
    its needle, NEEDLE_KIND). Hyperscan reports every match, overlapping ones too; the regular-expression engines
    the leftmost of overlapping ones (a line holding any needle is found by all three alike)."""
    if name.startswith("hyperscan") and (hs := engine(name)) is not None:
        return hs.hits(data, KIND_BITS)  # type: ignore[no-any-return]
    scanner = (engine("re2") if name in ("hyperscan", "hyperscan-wheel", "re2") else None) or PREFILTER
    kinds = NEEDLE_KIND
    return [m.end() << KIND_BITS | kinds.get(m.group(), 0) for m in scanner.finditer(data)]


def candidate_lines(data: bytes, base: int, *, max_line: int = 65536,
                    engine: str = "auto") -> list[tuple[int, bytes]]:
    """(offset, line) for lines with a needle; a byte scan in C, no decoding of the rest.
    A line longer than ``max_line`` is cut there (its start is what the rules read)."""
    out: list[tuple[int, bytes]] = []
    last_start = -1
    for code in hits(data, best_engine() if engine == "auto" else engine):
        end_of_match = code >> KIND_BITS
        start = data.rfind(b"\n", 0, end_of_match - 1) + 1  # the match's last byte may be the newline
        if start == last_start:
            continue
        end = data.find(b"\n", start)
        if end < 0:
            end = len(data)
        out.append((base + start, data[start : min(end, start + max_line)]))
        last_start = start
    return out
