"""The longest value a field can have when NCCL or PyTorch printed it, in digits or characters.

A job's user writes these logs. A field past its bound is no NCCL output: the whole line is rejected and
counted (matching.Rejected; the plugin counts it under ``REJECTED_SOURCE`` with a sample), never cut to a
shorter value that could be another valid id. Decimal numbers are bounded before int() (CPython refuses
past 4,300 digits; a 5,000-digit pid used to raise out of the parser). Each rule declares its fields'
bounds with these (rules/*.py); the prefix's are line.PREFIX_MAX.
"""

from __future__ import annotations

from typing import Final

INT_DIGITS: Final = 10  # C int, "%d": INT_MAX 2147483647
U64_DIGITS: Final = 20  # uint64/size_t, "%lu": 18446744073709551615
DEFAULT_FIELD_MAX: Final = 256  # a field a rule yields without declaring its bound
# a PyTorch sequence number past this is uninitialised memory (seen in public logs), not progress
SEQ_MAX: Final = 1 << 53
# a PyTorch Flight Recorder dump read whole (flight_recorder.py; hang_evidence.py opens it with this bound)
FR_DUMP_MAX_BYTES: Final = 64 << 20
