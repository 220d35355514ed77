"""gna_types.entities: one PCI normal form for the four spellings the agent reads (sysfs, NVIDIA's kernel
messages, NVML, NCCL), so ``gpu:<pci>`` built by any collector is the one the fleet matches; entity
constructors and readers that round-trip; nothing a hostile string can make raise."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from gna_types import entities as e

NORMAL = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]")
addresses = st.tuples(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7))


@given(addresses)
def test_every_spelling_of_one_address_is_one_entity(a: tuple[int, int, int, int]) -> None:
    domain, bus, dev, fn = a
    sysfs = f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"  # drivers/pci/probe.c: "%04x:%02x:%02x.%d"
    nvml = f"{domain:08X}:{bus:02X}:{dev:02X}.{fn}"  # nvml.h NVML_DEVICE_PCI_BUS_ID_FMT, upper case
    nccl = f"{int(sysfs.replace(':', '').replace('.', ''), 16):x}"  # NCCL busIdToInt64, printed "%lx"
    assert e.parse_pci(sysfs) == e.parse_pci(nvml) == e.parse_pci(nvml.encode()) == e.pci_from_nccl(nccl) == sysfs
    assert e.gpu(nvml) == e.gpu(sysfs) == f"gpu:{sysfs}"
    if fn == 0:  # NVIDIA's kernel messages print no function: "Xid (PCI:%04x:%02x:%02x)"
        assert e.parse_pci(f"PCI:{domain:04X}:{bus:02X}:{dev:02X}") == sysfs
        if domain == 0:
            assert e.parse_pci(f"{bus:02x}:{dev:02x}") == sysfs  # no domain


def test_known_spellings() -> None:
    assert e.normal_pci("PCI:0000:3B:00") == "0000:3b:00.0"
    assert e.normal_pci(b"00000000:3B:00.0") == "0000:3b:00.0"
    assert e.pci_from_nccl("18000") == "0000:18:00.0"
    for bad in (None, "", "zz", "1" * 17, "0x18"):
        assert e.pci_from_nccl(bad) is None
    for bad in ("0000:3b:20.0", "10000:3b:00.0", "0000:3b:00.8", "gpu0", "0000:3b:00.0:1", "0" * 30):
        assert e.parse_pci(bad) is None
        assert e.normal_pci(bad) == bad.lower()  # kept as it came: shown, matches nothing else


@given(st.one_of(st.text(max_size=64), st.binary(max_size=64)))
def test_no_string_makes_the_normaliser_raise(value: str | bytes) -> None:
    out = e.parse_pci(value)
    assert out is None or NORMAL.fullmatch(out)
    assert isinstance(e.normal_pci(value), str)
    if isinstance(value, str):
        nccl = e.pci_from_nccl(value)
        assert nccl is None or NORMAL.fullmatch(nccl)


@given(st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=20), st.one_of(st.none(), st.integers(0, 255)))
def test_ib_entities_round_trip(hca: str, port: int | None) -> None:
    ent = e.ib(hca, port)
    assert e.kind_of(ent) == "ib"
    assert e.parse_ib(ent) == (hca, port)


def test_readers_refuse_what_they_do_not_name() -> None:
    assert e.parse_ib("gpu:0000:3b:00.0") is None
    assert e.parse_ib("ib:") is None and e.parse_ib("ib:mlx5_0/x") is None and e.parse_ib("ib:a/1/2") is None
    assert e.kind_of("node") == ""
    assert e.ranks([3]) == "rank:3" and e.ranks([3, 5]) == "ranks:3,5"
    assert e.nccl_process("h", 7) == "nccl:h:7" and e.process("h:7") == "process:h:7"
    assert e.nvswitch("PCI:0000:C5:00") == "nvswitch:0000:c5:00.0"
