"""The bounded field types the node's typed details (gna_types/gpu_details.py, network_details.py,
host_details.py, storage_details.py) are built from, each bound with the source that sets it.

A field a collector always sends is required (its absence, or a misspelt keyword, fails at construction
and in mypy); one it sends on some messages only defaults to ``msgspec.UNSET``, so a Struct encodes exactly
the keys the collector gave: never a default it did not send, always a ``null`` it did.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec
from msgspec import UNSET, Meta, UnsetType

__all__ = ["UNSET", "UnsetType"]

# Text --------------------------------------------------------------------------------------------------
KMSG_TEXT_MAX: Final = 4096  # collectors/formats/kmsg_records.py MAX_MESSAGE: a record's text is cut there
PATH_MAX: Final = 4096  # Linux PATH_MAX (include/uapi/linux/limits.h)
ERROR_MAX: Final = 500  # agent/framework.py cuts a collector's last error there
CITATION_MAX: Final = 512  # a source reference ("NVIDIA/DCGM v4.6.0 dcgmlib/src/DcgmHealthWatch.cpp ...")

KmsgText = Annotated[str, Meta(max_length=KMSG_TEXT_MAX, description="the kernel's own words (one record)")]
FilePath = Annotated[str, Meta(max_length=PATH_MAX)]
Citation = Annotated[str, Meta(max_length=CITATION_MAX)]
Rule = Annotated[str, Meta(max_length=256, description="the rule a value broke, as text")]
Word = Annotated[str, Meta(max_length=64, description="an identifier: a state name, a reason, a counter")]
Name = Annotated[str, Meta(max_length=256, description="a name: a process's comm, a GPU model, a symbol")]
Severity = Annotated[str, Meta(max_length=16)]  # "info" | "warning" | "critical"
# PCI address "dddd:bb:dd.f" (gna_types/entities.py normal_pci); what a driver printed may be longer
Pci = Annotated[str, Meta(max_length=32, description="a PCI address, dddd:bb:dd.f")]
Hca = Annotated[str, Meta(max_length=64, description="an RDMA device, /sys/class/infiniband/<hca>")]
Module = Annotated[str, Meta(max_length=64)]  # a kernel module name (MODULE_NAME_LEN: 64 - sizeof(long))
Label = Annotated[str, Meta(max_length=16, description="nvidia-smi's label of a device, GPU<i>/NIC<j>")]

# Numbers -----------------------------------------------------------------------------------------------
Count = Annotated[int, Meta(ge=0)]
U64 = Annotated[int, Meta(ge=0)]  # a kernel/firmware u64 counter (msgspec bounds stop at int64: no upper bound)
Pid = Annotated[int, Meta(ge=0, le=(1 << 22))]  # Linux PID_MAX_LIMIT (include/linux/threads.h)
Seconds = Annotated[float, Meta(ge=0)]
Timestamp = Annotated[str, Meta(max_length=32, description="RFC 3339 UTC, milliseconds: 2026-01-02T03:04:05.678Z")]
Ratio = Annotated[float, Meta(ge=0, le=1)]
Bytes = Annotated[float, Meta(ge=0)]  # JuiceFS's and statvfs's byte counts (JuiceFS reports float64)
Celsius = Annotated[float, Meta(ge=-273, le=1000)]  # NVML temperatures (plausible_temp keeps far less)

# Collections -------------------------------------------------------------------------------------------
Words = Annotated[list[Word], Meta(max_length=256)]
Hcas = Annotated[list[Hca], Meta(max_length=256)]  # RDMA devices of one node (an HGX node has 8-10 + storage)
Paths = Annotated[list[FilePath], Meta(max_length=256)]
Texts = Annotated[list[KmsgText], Meta(max_length=16)]
# an open vector of named values (a straggler signal vector, a counter map): values carried as they came
Vector = Annotated[dict[Annotated[str, Meta(max_length=128)], Any], Meta(max_length=256)]
Numbers = Annotated[dict[Annotated[str, Meta(max_length=128)], float | None], Meta(max_length=256)]


class Occurrences(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What every kernel-log finding counted per window carries (collectors/kmsg_xid.py, gna_sdk.Window): how
    many, the record's own time, and -- in a window's summary -- the window, the first record's wall time and
    the records' own span. The finding's Struct adds what it is about."""

    count: Count
    logged_at: Timestamp | UnsetType = UNSET  # the record's own time (uptime stamp + /proc/stat btime)
    window_s: Seconds | UnsetType = UNSET
    aggregated: bool | UnsetType = UNSET
    first_seen: float | UnsetType = UNSET
    span_s: Seconds | UnsetType = UNSET
