"""The PCIe Access Control Services (ACS) capability of a PCI function, read from its configuration space
(``/sys/bus/pci/devices/<bdf>/config``).

Layout (linux v6.1 include/uapi/linux/pci_regs.h, the PCIe Base Specification's "ACS Extended Capability"):
extended capabilities start at 0x100 (``PCI_CFG_SPACE_SIZE``) and end before 0x1000
(``PCI_CFG_SPACE_EXP_SIZE``); each begins with a 32-bit header, ``PCI_EXT_CAP_ID(h) = h & 0xffff``,
``PCI_EXT_CAP_VER(h) = (h >> 16) & 0xf``, ``PCI_EXT_CAP_NEXT(h) = (h >> 20) & 0xffc`` (0: the last).
ACS is ``PCI_EXT_CAP_ID_ACS`` 0x0d; its 16-bit capability register at +0x04 (``PCI_ACS_CAP``), its 16-bit
control register at +0x06 (``PCI_ACS_CTRL``), both with the bits ``PCI_ACS_SV`` 0x01 .. ``PCI_ACS_DT`` 0x40.
Little-endian, as PCI configuration space is. sysfs gives an unprivileged reader only the first 64 bytes:
then the extended capabilities are not visible and the answer is "unknown", never "no ACS".
"""

from __future__ import annotations

from dataclasses import dataclass

PCI_CFG_SPACE_SIZE = 0x100
PCI_CFG_SPACE_EXP_SIZE = 0x1000
PCI_EXT_CAP_ID_ACS = 0x0D
PCI_ACS_CAP = 0x04
PCI_ACS_CTRL = 0x06
# PCI_ACS_* bits of the capability and control registers
ACS_BITS: dict[int, str] = {0x01: "source_validation", 0x02: "translation_blocking",
                            0x04: "p2p_request_redirect", 0x08: "p2p_completion_redirect",
                            0x10: "upstream_forwarding", 0x20: "p2p_egress_control", 0x40: "direct_translated_p2p"}
# the controls that send peer-to-peer traffic up to the root complex (or block it) instead of across the switch
P2P_REDIRECT = 0x04 | 0x08 | 0x20
MAX_CAPS = (PCI_CFG_SPACE_EXP_SIZE - PCI_CFG_SPACE_SIZE) // 4  # a list longer than this loops


@dataclass(frozen=True)
class AcsState:
    offset: int  # where the capability sits in configuration space
    capability: int  # PCI_ACS_CAP
    control: int  # PCI_ACS_CTRL

    @property
    def enabled(self) -> list[str]:
        return [name for bit, name in ACS_BITS.items() if self.control & bit]

    @property
    def redirects_p2p(self) -> bool:
        return bool(self.control & P2P_REDIRECT)


def _u32(config: bytes, off: int) -> int:
    return int.from_bytes(config[off:off + 4], "little")


def parse_acs(config: bytes) -> AcsState | bool | None:
    """The function's ACS capability; None when it has none; False when the extended configuration space is
    not in ``config`` (shorter than 4096 bytes: an unprivileged read, or a conventional PCI function)."""
    if len(config) < PCI_CFG_SPACE_EXP_SIZE:
        return False
    off, seen = PCI_CFG_SPACE_SIZE, set[int]()
    while off and len(seen) < MAX_CAPS and off not in seen and PCI_CFG_SPACE_SIZE <= off <= len(config) - 8:
        seen.add(off)
        header = _u32(config, off)
        if header in (0, 0xFFFFFFFF):  # no extended capabilities, or a function that does not answer
            return None
        if header & 0xFFFF == PCI_EXT_CAP_ID_ACS:
            return AcsState(off, int.from_bytes(config[off + PCI_ACS_CAP:off + PCI_ACS_CAP + 2], "little"),
                            int.from_bytes(config[off + PCI_ACS_CTRL:off + PCI_ACS_CTRL + 2], "little"))
        off = (header >> 20) & 0xFFC
    return None
