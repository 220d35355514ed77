"""perftest's ``ib_write_bw`` report: the result table and the failure lines it prints instead.

Format, from linux-rdma/perftest v4.5-0.20 (9411e12bad57fb36754e6f77b9ce92a7af1eb22a):

* src/perftest_parameters.h: ``RESULT_LINE`` (a row of dashes), the header ``RESULT_FMT_G`` `` #bytes
  #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]`` with ``--report_gbits`` (``RESULT_FMT``
  ``...[MB/sec]`` without; the ``_PER_PORT`` forms add four columns on dual-port runs), each row ``REPORT_FMT``
  `` %-7lu    %-10lu       %-7.2lf            %-7.2lf		   %-7.6lf`` (bytes, iterations, peak, average,
  message rate);
* src/write_bw.c and src/perftest_communication.c: what it prints on stderr when it cannot run, e.g.
  `` Couldn't get context for the device``, ``Couldn't connect to %s:%d``, `` Unable to init the socket
  connection``, `` Failed to exchange data between server and clients``, ``Problems with warm up``, and
  `` Completion with error at client`` (perftest_resources.c), each followed by a nonzero exit.

``--use_cuda=<gpu>`` (GPUDirect RDMA from that GPU's memory) changes none of it. Azure reads the average
(azurehpc-health-checks customTests/azure_ib_write_bw_gdr.nhc: ``ib_bandwidth=${LINE[3]}``); so do we.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MAX_BYTES = 1 << 20
MAX_ROWS = 256
MAX_NOTES = 16
NOTE_MAX = 300
_HEADER = re.compile(r"#bytes.*BW average\[(Gb/sec|MB/sec)\]")
_FAILURE = re.compile(r"^(Couldn't|Unable to|Failed to|Problems with|Completion with error|Error occurred|"
                      r"Parser function exited|No IB devices found|IB device \S+ not found|Conflicting CPU frequency)")
MBS_TO_GBITS = 0x100000 / 125e6  # perftest_resources.c: format_factor 0x100000 (MB/sec) or 125000000 (Gb/sec)


@dataclass(frozen=True)
class BwRow:
    size: int
    iterations: int
    peak: float
    average: float  # in the header's unit
    msg_rate: float


@dataclass
class WriteBwResult:
    unit: str | None = None  # "Gb/sec" | "MB/sec"
    rows: list[BwRow] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    unparsed: int = 0
    truncated: bool = False

    @property
    def average_gbits(self) -> float | None:
        """The largest message size's average bandwidth in Gb/s."""
        if not self.rows:
            return None
        row = max(self.rows, key=lambda r: r.size)
        return row.average if self.unit == "Gb/sec" else row.average * MBS_TO_GBITS


def _floats(tokens: list[str]) -> list[float] | None:
    try:
        vals = [float(t) for t in tokens]
    except ValueError:
        return None
    return vals if all(math.isfinite(v) and v >= 0 for v in vals) else None


def parse(text: str) -> WriteBwResult:
    """One ib_write_bw run's stdout and stderr together; never raises."""
    res = WriteBwResult()
    if len(text) > MAX_BYTES:
        text, res.truncated = text[:MAX_BYTES], True
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if m := _HEADER.search(line):
            res.unit = m.group(1)
            continue
        if _FAILURE.match(line):
            if len(res.failures) < MAX_NOTES:
                res.failures.append(line[:NOTE_MAX])
            continue
        if res.unit is None:
            continue  # the parameters block before the table
        tokens = line.split()
        if not tokens[0].isdigit() or len(tokens[0]) > 20:
            continue
        vals = _floats(tokens[:5]) if len(tokens) >= 5 and tokens[1].isdigit() else None
        if vals is None:
            res.unparsed += 1
            continue
        if len(res.rows) >= MAX_ROWS:
            res.truncated = True
            break
        res.rows.append(BwRow(size=int(tokens[0]), iterations=int(tokens[1]), peak=vals[2], average=vals[3],
                              msg_rate=vals[4]))
    return res
