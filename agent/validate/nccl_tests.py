"""nccl-tests' ``all_reduce_perf`` output: the result table, ``#wrong``, and the two summary lines.

Format, from NVIDIA/nccl-tests v2.14.1 (b4300cc79d05dd35e26f13afcdb4938f29aa31a5) src/common.cu:

* the header, ``PRINT("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\\n", "size",
  "count", "type", "redop", "root", timeStr, "algbw", "busbw", "#wrong", timeStr, "algbw", "busbw",
  "#wrong")`` (run(), ~line 1084), the first group out-of-place, the second in-place;
* each row, ``PRINT("%12li  %12li  %8s  %6s  %6s", bytes, count, type, op, root)`` (TimeTest) then per
  group ``PRINT("  %7s  %6.2f  %6.2f  %5g", time, algBw, busBw, wrongElts)``, or ``%5s`` "N/A" when data
  checking is off (BenchTime);
* ``# Out of bounds values : %d %s`` (OK | FAILED) and ``# Avg bus bandwidth    : %g %s`` (the mean busbw of
  every printed cell; "FAILED"/"OK" only when NCCL_TESTS_MIN_BW is set);
* failures, printed on stdout: ``<host>: Test NCCL failure <file>:<line> '<err> / <last>'``, ``... Test CUDA
  failure ...``, `` .. <host> pid <pid>: Test failure <file>:<line>`` (src/common.h NCCLCHECK/CUDACHECK/
  TESTCHECK) and ``<host>: Test timeout (<n>s) <file>:<line>`` (testStreamSynchronize).

v2.19.6 (src/util.cu writeResultHeader/writeResultFooter) prints the same words: ``# %-20s : %d %s``, and
with ``-I 1`` four per-iteration columns after each ``#wrong``; the columns are therefore located by the
header's names, with v2.14.1's fixed layout as the fallback when no header was seen. We read busbw, never
algbw (busbw is the figure comparable across GPU counts: doc/PERFORMANCE.md), and ``#wrong`` must be 0.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MAX_BYTES = 4 << 20  # a sweep of every size from 8 B to 16 GiB is ~40 rows of ~120 bytes
MAX_ROWS = 4096
MAX_NOTES = 32
NOTE_MAX = 300
# v2.14.1's header, tokenised after its "#"
DEFAULT_COLUMNS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                   "time", "algbw", "busbw", "#wrong")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d{1,12})\s*(OK|FAILED)?\s*$")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S{1,40})\s*(OK|FAILED)?\s*$")
_FAILURE = re.compile(r"Test (?:NCCL|CUDA) failure|: Test failure |: Test timeout \(")


@dataclass(frozen=True)
class Row:
    """One message size: busbw (GB/s) and #wrong of the out-of-place and in-place runs (None: not printed,
    or "N/A" when data checking was off)."""

    size: int
    busbw_oop: float | None
    busbw_ip: float | None
    wrong_oop: int | None
    wrong_ip: int | None

    @property
    def busbw(self) -> float | None:
        """The mean of the two busbw cells, as ``# Avg bus bandwidth`` averages them."""
        vals = [v for v in (self.busbw_oop, self.busbw_ip) if v is not None]
        return sum(vals) / len(vals) if vals else None


@dataclass
class AllReduceResult:
    rows: list[Row] = field(default_factory=list)
    out_of_bounds: int | None = None  # "# Out of bounds values : N"
    avg_busbw: float | None = None  # "# Avg bus bandwidth : X"
    failures: list[str] = field(default_factory=list)  # the tool's own failure lines
    unparsed: int = 0  # table-like lines that did not parse
    truncated: bool = False  # input over MAX_BYTES or MAX_ROWS: the rest was not read

    @property
    def wrong(self) -> int:
        """Every #wrong cell summed (0 when data checking was off)."""
        return sum(w for r in self.rows for w in (r.wrong_oop, r.wrong_ip) if w is not None)

    @property
    def checked(self) -> bool:
        """At least one #wrong cell was printed as a number (data checking was on)."""
        return any(w is not None for r in self.rows for w in (r.wrong_oop, r.wrong_ip))

    @property
    def largest(self) -> Row | None:
        return max(self.rows, key=lambda r: r.size) if self.rows else None


def _num(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) and v >= 0 else None


def _count(text: str) -> int | None:
    v = _num(text)
    return int(v) if v is not None and v == int(v) else None


def _note(out: list[str], line: str) -> None:
    if len(out) < MAX_NOTES:
        out.append(line.strip()[:NOTE_MAX])


def parse(text: str) -> AllReduceResult:
    """The table and summary of one all_reduce_perf run's stdout; never raises."""
    res = AllReduceResult()
    if len(text) > MAX_BYTES:
        text, res.truncated = text[:MAX_BYTES], True
    columns: tuple[str, ...] = DEFAULT_COLUMNS
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if _FAILURE.search(line):
            _note(res.failures, line)
            continue
        if line.startswith("#"):
            if m := _OOB.match(line):
                res.out_of_bounds = int(m.group(1))
            elif m := _AVG.match(line):
                res.avg_busbw = _num(m.group(1))
            else:
                names = tuple(line[1:].split())
                if names[:1] == ("size",) and "busbw" in names:
                    columns = names
            continue
        tokens = line.split()
        if not tokens or not tokens[0].isdigit() or len(tokens[0]) > 20:
            continue  # the tool's other chatter ("nThread ...", NCCL's own lines)
        if len(res.rows) >= MAX_ROWS:
            res.truncated = True
            break
        busbw = [i for i, c in enumerate(columns) if c == "busbw"]
        wrong = [i for i, c in enumerate(columns) if c == "#wrong"]
        if len(tokens) < max(busbw + wrong, default=0) + 1 or not busbw:
            res.unparsed += 1
            continue
        bb = [_num(tokens[i]) for i in busbw[:2]]
        wr = [_count(tokens[i]) if tokens[i] != "N/A" else None for i in wrong[:2]]
        if all(v is None for v in bb):
            res.unparsed += 1
            continue
        bb += [None] * (2 - len(bb))
        wr += [None] * (2 - len(wr))
        res.rows.append(Row(size=int(tokens[0]), busbw_oop=bb[0], busbw_ip=bb[1], wrong_oop=wr[0], wrong_ip=wr[1]))
    return res
