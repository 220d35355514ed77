"""nvbandwidth's plain-text output: per testcase a status line, a titled bandwidth matrix and its SUM.

Format, from NVIDIA/nvbandwidth v0.8 (66746a3bef61c8c2e12ab34955310da70b9e38cb):

* ``Running <testcase key>.`` before a testcase, ``Waived: `` when its filter rejects this machine, ``Error: <msg>``
  when it threw (output.cpp Output::addTestcase / setTestcaseStatusAndAddIfNeeded; nvbandwidth.cpp runTestcase;
  the status words NVB_RUNNING "Running", NVB_WAIVED "Waived", NVB_ERROR_STATUS "Error" in json_output.cpp);
* the matrix's title, e.g. ``memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)`` (testcases_ce.cpp
  addTestcaseResults), then a header of column labels (``std::setw(10)``) and one row per source: its label,
  then each cell ``std::fixed << std::setprecision(2)`` or ``N/A`` where the pair was not measured (the
  diagonal of a GPU-to-GPU matrix) (inline_common.h ``operator<<(PeerValueMatrix)``), a blank line, and
  ``SUM <testcase key> <sum>`` (``&&&& PERF <key> <sum><unit>`` with --perfFormatter).

The testcases read here are Azure's (azurehpc-health-checks customTests/azure_gpu_bandwidth.nhc):
``host_to_device_memcpy_ce``, ``device_to_host_memcpy_ce`` (a 1 x GPUs matrix, GB/s per GPU) and
``device_to_device_memcpy_read_ce`` (GPUs x GPUs, GB/s per ordered pair).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MAX_BYTES = 4 << 20
MAX_MATRICES = 256
MAX_DIM = 1024  # rows or columns of one matrix (GPUs, or CPU + GPUs)
MAX_NOTES = 32
NOTE_MAX = 300
_RUNNING = re.compile(r"^Running (\S{1,128})\.$")
_STATUS = re.compile(r"^(Waived|Error|Not Found):\s?(.*)$")
_TITLE = re.compile(r"^(.{1,200}) bandwidth \(GB/s\)$")
_SUM = re.compile(r"^(?:SUM|&&&& PERF) (\S{1,128}) (\S{1,40}?)(?:GB/s)?$")


@dataclass
class Matrix:
    """One testcase's matrix: ``cells[row label][column label]`` in GB/s, None for N/A."""

    key: str  # the testcase key of the preceding "Running" line ("" if none was seen)
    title: str
    columns: list[str] = field(default_factory=list)
    cells: dict[str, dict[str, float | None]] = field(default_factory=dict)
    total: float | None = None  # the SUM line

    def measured(self) -> list[tuple[str, str, float]]:
        """Every (row, column, GB/s) that was measured: N/A cells left out, and in a GPU(row)-GPU(column) matrix
        a GPU's pair with itself (a CPU(row) matrix's row 0 is the CPU: its column 0 is GPU 0)."""
        peers = "GPU(row)" in self.title
        return [(r, c, v) for r, row in self.cells.items() for c, v in row.items()
                if v is not None and not (peers and r == c)]


@dataclass
class NvbandwidthResult:
    matrices: dict[str, Matrix] = field(default_factory=dict)  # testcase key -> its (last) matrix
    status: dict[str, str] = field(default_factory=dict)  # testcase key -> "Running" | "Waived" | "Error: ..."
    unparsed: int = 0
    truncated: bool = False


def _cell(text: str) -> float | None:
    if text == "N/A":
        return None
    try:
        v = float(text)
    except ValueError:
        raise ValueError(text) from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(text)
    return v


def parse(text: str) -> NvbandwidthResult:
    """Every matrix and testcase status of one run's stdout; never raises."""
    res = NvbandwidthResult()
    if len(text) > MAX_BYTES:
        text, res.truncated = text[:MAX_BYTES], True
    key = ""
    current: Matrix | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if current is not None:
            if not line:
                if current.cells:
                    current = None  # the blank line after the rows
                continue
            tokens = line.split()
            if not current.columns:
                if len(tokens) > MAX_DIM:
                    res.unparsed += 1
                    current = None
                    continue
                current.columns = tokens
                continue
            if len(tokens) == len(current.columns) + 1 and len(current.cells) < MAX_DIM:
                try:
                    current.cells[tokens[0]] = {c: _cell(t) for c, t in zip(current.columns, tokens[1:], strict=True)}
                    continue
                except ValueError:
                    pass
            res.unparsed += 1
            current = None  # not a row: fall through and read the line as anything else
        if m := _RUNNING.match(line):
            key = m.group(1)
            if len(res.status) < MAX_MATRICES:
                res.status[key] = "Running"
        elif m := _STATUS.match(line):
            if key and key in res.status:
                res.status[key] = m.group(1) + (f": {m.group(2)[:NOTE_MAX]}" if m.group(2) else "")
        elif m := _TITLE.match(line):
            if len(res.matrices) >= MAX_MATRICES:
                res.truncated = True
                break
            current = Matrix(key=key, title=line)
            res.matrices[key] = current
        elif m := _SUM.match(line):
            mat = res.matrices.get(m.group(1))
            if mat is not None:
                try:
                    mat.total = float(m.group(2))
                except ValueError:
                    res.unparsed += 1
    return res
