"""Entities: the ``entity`` field of every message, one constructor and one reader per kind.

    gpu:<pci>            a GPU by its PCI address (``0000:3b:00.0``: the form sysfs uses)
    nvswitch:<pci>       an NVSwitch by its PCI address
    ib:<hca>/<port>      an InfiniBand (or RoCE) port; ``ib:<hca>`` the whole HCA
    nccl:<host>:<pid>    one NCCL process, as its log names it
    process:<host>:<pid> the fleet's name for a culprit process
    rank:<r>             one rank of a job; ``ranks:<r>,<r>,...`` several

PCI addresses reach the agent in four spellings of the same thing, and ``gpu:<pci>`` matches across
collectors and the fleet only if all four become one:

- sysfs and the kernel's own prints: ``0000:3b:00.0`` (Documentation/PCI/sysfs-pci.rst; the
  ``%04x:%02x:%02x.%d`` of drivers/pci/probe.c pci_setup_device -> dev_set_name);
- NVIDIA's kernel messages: ``NVRM: Xid (PCI:0000:3b:00): 79, ...`` -- domain:bus:device without the
  function, upper or lower case (open-gpu-kernel-modules kernel-open/nvidia/nv.c, nv_report_error:
  "Xid (PCI:%04x:%02x:%02x)");
- NVML: ``00000000:3B:00.0``, an 8-digit domain (nvml.h nvmlPciInfo_t.busId,
  NVML_DEVICE_PCI_BUS_ID_FMT "%08X:%02X:%02X.0");
- NCCL: one hex number of the address's digits, ``18000`` for ``0000:18:00.0`` (NCCL src/misc/utils.cc
  busIdToInt64 / int64ToBusId; printed with "%lx" in init.cc's "Init COMPLETE" and the topology dump).
"""

from __future__ import annotations

import re

_HEX = frozenset("0123456789abcdef")
_PCI = re.compile(r"([0-9a-f]{1,8}):([0-9a-f]{1,2}):([0-9a-f]{1,2})(?:\.([0-7]))?")


def parse_pci(value: str | bytes | None) -> str | None:
    """The normal form ``dddd:bb:dd.f`` of a PCI address in any of the kernel's, sysfs's or NVML's
    spellings (``PCI:`` prefix, 8-digit domain, no domain, no function, any case); None if it is not one."""
    if value is None:
        return None
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    text = text.strip().lower().removeprefix("pci:")
    if len(text) > 24:
        return None
    if text.count(":") == 1:  # "3b:00" without a domain
        text = "0000:" + text
    m = _PCI.fullmatch(text)
    if m is None:
        return None
    domain, bus, dev, fn = m.groups()
    if int(domain, 16) > 0xFFFF or int(dev, 16) > 0x1F:
        return None
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn or '0'}"


def normal_pci(value: str | bytes) -> str:
    """``parse_pci``, or, for what is not a PCI address, the text as it came (trimmed, lower case):
    an entity is still built from it and is still shown, it only matches nothing else."""
    norm = parse_pci(value)
    if norm is not None:
        return norm
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    return text.strip().lower().removeprefix("pci:")


def pci_from_nccl(value: str | None) -> str | None:
    """NCCL's busId number (``18000``) back to the normal form; None if it is not one."""
    if not value or len(value) > 16 or not set(value.lower()) <= _HEX:
        return None
    s = value.lower().zfill(9)
    return parse_pci(f"{s[:-5]}:{s[-5:-3]}:{s[-3:-1]}.{s[-1]}")


def gpu(address: str | bytes) -> str:
    return f"gpu:{normal_pci(address)}"


def nvswitch(address: str | bytes) -> str:
    return f"nvswitch:{normal_pci(address)}"


def ib(hca: str, port: int | str | None = None) -> str:
    return f"ib:{hca}" if port is None else f"ib:{hca}/{port}"


def nccl_process(host: str, pid: int | str) -> str:
    return f"nccl:{host}:{pid}"


def process(host_pid: str) -> str:
    """The fleet's name for a culprit process, from its ``host:pid``."""
    return f"process:{host_pid}"


def ranks(rs: list[int] | tuple[int, ...]) -> str:
    """``rank:<r>`` for one, ``ranks:<r>,<r>,...`` for several (in the order given)."""
    return f"rank:{rs[0]}" if len(rs) == 1 else "ranks:" + ",".join(map(str, rs))


def kind_of(entity: str) -> str:
    """The kind before the first colon (``gpu``, ``ib``, ...); "" when there is none."""
    head, sep, _ = entity.partition(":")
    return head if sep else ""


def parse_ib(entity: str) -> tuple[str, int | None] | None:
    """``ib:<hca>/<port>`` -> (hca, port); ``ib:<hca>`` -> (hca, None); None for anything else."""
    if not entity.startswith("ib:"):
        return None
    hca, sep, port = entity[3:].partition("/")
    if not hca or "/" in port:
        return None
    if not sep:
        return hca, None
    return (hca, int(port)) if port.isdigit() and len(port) <= 3 else None
