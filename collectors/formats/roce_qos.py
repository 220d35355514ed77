"""Lossless-RoCE configuration and PFC pause counters of an mlx5 netdev, read without binaries.

ECN per priority (MLNX_OFED / DOCA's mlx5_core only; upstream Linux has no such files, so an absent
directory is "not seen", never "disabled"): ``/sys/class/net/<if>/ecn/<proto>/enable/<prio>`` for proto
``roce_np`` (notification point) and ``roce_rp`` (reaction point), prio 0-7, each "%d\\n" of
mlx5_query_port_cong_status(); a failed query prints nothing (an empty read: unknown). Layout from the OFED
tree's drivers/net/ethernet/mellanox/mlx5/core/en_sysfs.c (mlx5e_fill_attributes: kobject "enable" under
the protocol's kobject, one file per priority "0".."7") and en_ecn.c (mlx5e_show_ecn_enable), as carried in
oracle/linux-uek @f57c6307 (ECN_SOURCE).

PFC pause counters are ethtool statistics (Documentation/networking/device_drivers/ethernet/mellanox/mlx5/
counters.rst, torvalds/linux @844e31bb, "Priority Port Counters"): ``rx_prio<p>_pause``, ``tx_prio<p>_pause``
(frames), ``rx_prio<p>_pause_duration``, ``tx_prio<p>_pause_duration`` (microseconds), "available only if
PFC was enabled on priority p". They are read with the SIOCETHTOOL ioctl (ETHTOOL_GSSET_INFO for the count,
ETHTOOL_GSTRINGS for the names, ETHTOOL_GSTATS for the values; struct layouts of include/uapi/linux/
ethtool.h, SIOCETHTOOL 0x8946 of include/uapi/linux/sockios.h), or, under a host root that is not "/",
from ``ethtool -S`` text saved at :data:`FIXTURE_DIR` (the test and snapshot seam, see there).
"""

from __future__ import annotations

import ctypes
import fcntl
import re
import socket
import struct
from collections.abc import Callable

ECN_SOURCE = ("MLNX_OFED mlx5_core drivers/net/ethernet/mellanox/mlx5/core/en_sysfs.c mlx5e_fill_attributes "
              "and en_ecn.c mlx5e_show_ecn_enable (oracle/linux-uek @f57c6307); not in upstream Linux")
COUNTERS_SOURCE = ("torvalds/linux Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst "
                   "@844e31bb (Priority Port Counters)")
ECN_PROTOCOLS = ("roce_np", "roce_rp")
PRIORITIES = range(8)

# The test and snapshot seam: under a host root other than "/" there is no netdev to ask, so the stats of
# <if> come from <root>/.sim/ethtool-S/<if>, holding what ``ethtool -S <if>`` prints ("     name: value"
# lines under "NIC statistics:"). No real host has this path; it stands for the ioctl, not for a file.
FIXTURE_DIR = "/.sim/ethtool-S"

# include/uapi/linux/sockios.h and include/uapi/linux/ethtool.h
SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS = 0x0000001B
ETHTOOL_GSTATS = 0x0000001D
ETHTOOL_GSSET_INFO = 0x00000037
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
MAX_STATS = 16384  # mlx5 exports a few thousand with many channels; more is a broken or hostile driver
_SLACK = 256  # ETHTOOL_GSTATS/GSTRINGS copy the driver's own count: room if it grew between the calls
MAX_VALUE = (1 << 64) - 1

StatsReader = Callable[[str], dict[str, int]]  # ifname -> counters; OSError when the netdev cannot be asked

_NAME = re.compile(r"^[A-Za-z0-9_.:\[\]-]{1,64}$")


def parse_ecn_enable(text: str | None) -> bool | None:
    """One ``enable/<prio>`` file: "1" on, "0" off; None for anything else (unreadable, an empty read of a
    failed firmware query, garbage)."""
    if text is None:
        return None
    value = text.strip()
    if value == "1":
        return True
    if value == "0":
        return False
    return None


def pause_names(prio: int) -> dict[str, str]:
    """The role of each PFC counter of one priority -> its ethtool name."""
    return {"rx_frames": f"rx_prio{prio}_pause", "tx_frames": f"tx_prio{prio}_pause",
            "rx_duration_us": f"rx_prio{prio}_pause_duration", "tx_duration_us": f"tx_prio{prio}_pause_duration"}


def parse_ethtool_s(text: str, limit: int = MAX_STATS) -> dict[str, int]:
    """``ethtool -S`` output: "     name: value" per line; other lines (the header, garbage, values out of
    u64 range, names no driver uses) are skipped. At most ``limit`` counters."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().rpartition(":")
        name, value = name.strip(), value.strip()
        if not sep or not _NAME.fullmatch(name) or not value.isascii() or not value.isdigit() or len(value) > 20:
            continue
        n = int(value)
        if n > MAX_VALUE:
            continue
        out[name] = n
        if len(out) >= limit:
            break
    return out


def decode_gstrings(buf: bytes, n: int) -> list[str]:
    """The ``data`` of a struct ethtool_gstrings: ``n`` NUL-padded names of ETH_GSTRING_LEN bytes each."""
    n = max(0, min(n, MAX_STATS, len(buf) // ETH_GSTRING_LEN))
    return [buf[i * ETH_GSTRING_LEN:(i + 1) * ETH_GSTRING_LEN].split(b"\0", 1)[0].decode("ascii", "replace")
            for i in range(n)]


def decode_gstats(buf: bytes, n: int) -> list[int]:
    """The ``data`` of a struct ethtool_stats: ``n`` native-endian u64."""
    n = max(0, min(n, MAX_STATS, len(buf) // 8))
    return list(struct.unpack_from(f"={n}Q", buf, 0)) if n else []


def pair_stats(names: list[str], values: list[int]) -> dict[str, int]:
    """Names and values of one read; a count that differs between the two (the driver changed its set
    between the calls) yields nothing rather than mislabelled values."""
    if len(names) != len(values):
        return {}
    return {k: v for k, v in zip(names, values, strict=True) if k}


def valid_ifname(name: str) -> bool:
    """A name a netdev can have (net/core/dev.c ``dev_valid_name``: shorter than IFNAMSIZ, not "." or "..", no
    '/', ':' or whitespace), ASCII: what may be put in an ifreq or a DCB_ATTR_IFNAME."""
    return (0 < len(name) < IFNAMSIZ and name not in (".", "..") and name.isascii()
            and not any(c in "/:" or c.isspace() for c in name))


def _ioctl(sock: socket.socket, ifname: str, data: ctypes.Array[ctypes.c_char]) -> None:
    """SIOCETHTOOL with struct ifreq {char ifr_name[IFNAMSIZ]; union {... void *ifr_data;}} (40 bytes on LP64)."""
    ifreq = bytearray(struct.pack(f"{IFNAMSIZ}sP", ifname.encode("ascii"), ctypes.addressof(data)))
    ifreq.extend(b"\0" * (40 - len(ifreq)))
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)


def ethtool_stats(ifname: str) -> dict[str, int]:
    """The netdev's ETH_SS_STATS set through SIOCETHTOOL in this process's network namespace (the agent
    runs with the host's). OSError (ENODEV, EOPNOTSUPP, EPERM) when it cannot be read."""
    if not valid_ifname(ifname):
        raise OSError(f"bad interface name {ifname!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        # struct ethtool_sset_info {u32 cmd; u32 reserved; u64 sset_mask; u32 data[];}
        info = ctypes.create_string_buffer(struct.pack("=IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS, 0), 20)
        _ioctl(sock, ifname, info)
        _cmd, _res, mask, count = struct.unpack("=IIQI", info.raw)
        if not mask & (1 << ETH_SS_STATS) or count > MAX_STATS:
            return {}
        room = count + _SLACK
        # struct ethtool_gstrings {u32 cmd; u32 string_set; u32 len; u8 data[];}
        strings = ctypes.create_string_buffer(struct.pack("=III", ETHTOOL_GSTRINGS, ETH_SS_STATS, count),
                                              12 + room * ETH_GSTRING_LEN)
        _ioctl(sock, ifname, strings)
        n_names = struct.unpack_from("=I", strings.raw, 8)[0]
        # struct ethtool_stats {u32 cmd; u32 n_stats; u64 data[];}
        stats = ctypes.create_string_buffer(struct.pack("=II", ETHTOOL_GSTATS, count), 8 + room * 8)
        _ioctl(sock, ifname, stats)
        n_values = struct.unpack_from("=I", stats.raw, 4)[0]
        if n_names > room or n_values > room:
            return {}
        return pair_stats(decode_gstrings(strings.raw[12:], n_names), decode_gstats(stats.raw[8:], n_values))
