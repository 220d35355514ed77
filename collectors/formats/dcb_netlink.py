"""PFC enablement and the DSCP trust of a netdev, read over DCB netlink (what ``dcb pfc show``, ``dcb app show``
and MLNX_OFED's ``mlnx_qos -i`` print), without a binary.

The request (include/uapi/linux/rtnetlink.h, include/uapi/linux/dcbnl.h; the same one iproute2's
dcb/dcb.c ``dcb_get_attribute_va`` sends): a NETLINK_ROUTE message of type RTM_GETDCB (78), NLM_F_REQUEST,
whose body is ``struct dcbmsg {u8 dcb_family = AF_UNSPEC; u8 cmd = DCB_CMD_IEEE_GET (21); u16 pad;}`` and one
attribute DCB_ATTR_IFNAME (1, a NUL-terminated string). Reading needs no capability (net/dcb/dcbnl.c
``dcb_doit`` asks CAP_NET_ADMIN for RTM_SETDCB only). The kernel answers (net/dcb/dcbnl.c
``dcbnl_ieee_fill``) with a message of the same type: DCB_ATTR_IFNAME, then a nest DCB_ATTR_IEEE (13) holding
DCB_ATTR_IEEE_PFC (2, ``struct ieee_pfc``, only when the driver has ``ieee_getpfc``), DCB_ATTR_IEEE_APP_TABLE
(3, a nest of DCB_ATTR_IEEE_APP (1) / DCB_ATTR_DCB_APP (2) entries, each ``struct dcb_app {u8 selector; u8
priority; u16 protocol;}``) and others this reader skips (ETS, MAXRATE, QCN, buffers, trust and rewrite
tables, the peer's), then DCB_ATTR_DCBX (14, u8) when the driver reports its DCBX mode. A netdev whose driver
has no DCB ops answers NLMSG_ERROR -EOPNOTSUPP; an unknown name -ENODEV (both checked against this host's
kernel in tests/test_dcb_netlink.py).

mlx5's trust state is not a netlink attribute of its own: in DSCP trust, mlx5e publishes one APP entry per
DSCP value with selector IEEE_8021QAZ_APP_SEL_DSCP (5), protocol = the DSCP, priority = its mapped priority,
and none in PCP trust ("No SEL_DSCP entry in non DSCP state": drivers/net/ethernet/mellanox/mlx5/core/
en_dcbnl.c ``mlx5e_dcbnl_dscp_app``). A function that is not the port's vport group manager (a VF) publishes
none either, nor does a device without the QPTS/QPDPM registers: the caller asks only for physical functions.
The first mlx5e DCB ops (torvalds/linux @08fb1dac) had no ``ieee_getpfc``: a reply without a PFC object is
"unknown", never "off".

Everything from the kernel is bounded before use: message and attribute lengths against the buffer, at most
:data:`MAX_ATTRS` attributes per level and :data:`MAX_APPS` APP entries; a short or malformed reply is a
:class:`DCBReplyError`, never a guess.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
from dataclasses import dataclass, field

from collectors.formats.roce_qos import IFNAMSIZ, valid_ifname

SOURCE = ("torvalds/linux include/uapi/linux/dcbnl.h and net/dcb/dcbnl.c dcbnl_ieee_fill (RTM_GETDCB "
          "DCB_CMD_IEEE_GET); mlx5 DSCP trust from drivers/net/ethernet/mellanox/mlx5/core/en_dcbnl.c "
          "mlx5e_dcbnl_dscp_app")

# The test and snapshot seam: under a host root other than "/" there is no netdev to ask, so the reply for
# <if> comes from <root>/.sim/dcb-ieee/<if>, the kernel's reply message as hex text. No real host has this path;
# it stands for the netlink query, not for a file.
FIXTURE_DIR = "/.sim/dcb-ieee"

# include/uapi/linux/netlink.h
NETLINK_ROUTE = 0
NLM_F_REQUEST = 0x1
NLMSG_ERROR = 0x2
NLMSG_DONE = 0x3
NLA_F_NESTED = 1 << 15
NLA_F_NET_BYTEORDER = 1 << 14
NLA_TYPE_MASK = ~(NLA_F_NESTED | NLA_F_NET_BYTEORDER) & 0xFFFF
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NLATTR = struct.Struct("=HH")  # len, type
# include/uapi/linux/rtnetlink.h
RTM_GETDCB = 78
# include/uapi/linux/dcbnl.h
DCB_CMD_IEEE_GET = 21
DCB_ATTR_IFNAME = 1
DCB_ATTR_IEEE = 13
DCB_ATTR_DCBX = 14
DCB_ATTR_IEEE_PFC = 2
DCB_ATTR_IEEE_APP_TABLE = 3
DCB_ATTR_IEEE_APP = 1
DCB_ATTR_DCB_APP = 2  # non-IEEE selectors (DCB_APP_SEL_PCP, 255), Linux 6.2+
IEEE_8021QAZ_APP_SEL_DSCP = 5
DCB_APP_SEL_PCP = 255
_DCBMSG = struct.Struct("=BBH")
# struct ieee_pfc {u8 pfc_cap; u8 pfc_en; u8 mbc; u16 delay; u64 requests[8]; u64 indications[8];}: natural
# alignment puts delay at offset 4 and requests at 8 (136 bytes)
_IEEE_PFC = struct.Struct("=BBBxHxx8Q8Q")
_DCB_APP = struct.Struct("=BBH")
# DCB_ATTR_DCBX bits (include/uapi/linux/dcbnl.h DCB_CAP_DCBX_*)
DCBX_BITS = {0x01: "host", 0x02: "lld_managed", 0x04: "cee", 0x08: "ieee", 0x10: "static"}

MAX_REPLY = 1 << 16  # dcbnl replies fit NLMSG_DEFAULT_SIZE (a page); this is ample
MAX_ATTRS = 256  # per nesting level
MAX_APPS = 1024  # 64 DSCP entries plus the other selectors' on any real port
TIMEOUT_S = 1.0


class DCBReplyError(ValueError):
    """A reply this reader cannot trust (short, lengths out of bounds, not an answer to the request)."""


@dataclass(frozen=True)
class DCBApp:
    selector: int
    priority: int
    protocol: int


@dataclass(frozen=True)
class DCBState:
    """What DCB_CMD_IEEE_GET said about one netdev. ``pfc_enabled`` is None when the driver gave no PFC
    object (no ``ieee_getpfc``): unknown, not off."""

    ifname: str
    pfc_cap: int | None = None
    pfc_enabled: frozenset[int] | None = None
    apps: tuple[DCBApp, ...] = ()
    dcbx: int | None = None
    skipped: dict[str, int] = field(default_factory=dict)  # what was malformed and dropped, by kind

    @property
    def dscp_map(self) -> dict[int, int]:
        """DSCP -> priority from the APP table's DSCP entries (IEEE_8021QAZ_APP_SEL_DSCP)."""
        return {a.protocol: a.priority for a in self.apps if a.selector == IEEE_8021QAZ_APP_SEL_DSCP}

    @property
    def trust(self) -> str:
        """mlx5's trust state as its APP table shows it: "dscp" when DSCP entries exist, else "pcp"."""
        return "dscp" if self.dscp_map else "pcp"

    @property
    def dcbx_modes(self) -> list[str]:
        return [name for bit, name in DCBX_BITS.items() if self.dcbx is not None and self.dcbx & bit]


def _attr(kind: int, payload: bytes) -> bytes:
    size = _NLATTR.size + len(payload)
    return _NLATTR.pack(size, kind) + payload + b"\0" * (-size % 4)


def request(ifname: str, seq: int) -> bytes:
    """The RTM_GETDCB / DCB_CMD_IEEE_GET request for ``ifname``."""
    if not valid_ifname(ifname):
        raise ValueError(f"bad interface name {ifname!r}")
    body = _DCBMSG.pack(socket.AF_UNSPEC, DCB_CMD_IEEE_GET, 0) + _attr(DCB_ATTR_IFNAME, ifname.encode() + b"\0")
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_GETDCB, NLM_F_REQUEST, seq & 0xFFFFFFFF, 0) + body


def attributes(buf: bytes, start: int, end: int) -> list[tuple[int, bytes]]:
    """The netlink attributes in ``buf[start:end]`` as (type without flags, payload); lengths are checked
    against ``end``, at most :data:`MAX_ATTRS`."""
    out: list[tuple[int, bytes]] = []
    pos = start
    while pos + _NLATTR.size <= end:
        length, kind = _NLATTR.unpack_from(buf, pos)
        if length < _NLATTR.size or pos + length > end:
            raise DCBReplyError(f"attribute at {pos} has length {length} beyond its container ({end - pos} left)")
        if len(out) >= MAX_ATTRS:
            raise DCBReplyError(f"more than {MAX_ATTRS} attributes at one level")
        out.append((kind & NLA_TYPE_MASK, bytes(buf[pos + _NLATTR.size:pos + length])))
        pos += (length + 3) & ~3
    return out


def _pfc(payload: bytes) -> tuple[int, frozenset[int]]:
    if len(payload) < 2:
        raise DCBReplyError(f"DCB_ATTR_IEEE_PFC of {len(payload)} bytes")
    # only pfc_cap and pfc_en are used: a driver built against an older, shorter struct still gives both
    cap, en = payload[0], payload[1]
    return cap, frozenset(p for p in range(8) if en >> p & 1)


def _app_table(table: bytes, apps: list[DCBApp], skipped: dict[str, int]) -> None:
    """The entries of one DCB_ATTR_IEEE_APP_TABLE appended to ``apps`` (at most :data:`MAX_APPS` in all); what
    no kernel sends (short, a priority past 7, a DSCP past 63) counted in ``skipped`` by kind."""
    for kind, entry in attributes(table, 0, len(table)):
        if kind not in (DCB_ATTR_IEEE_APP, DCB_ATTR_DCB_APP):
            continue
        why = None
        if len(entry) < _DCB_APP.size:
            why = "short_app"
        elif len(apps) >= MAX_APPS:
            why = "apps_over_limit"
        else:
            sel, prio, proto = _DCB_APP.unpack_from(entry, 0)
            if prio > 7 and sel != DCB_APP_SEL_PCP:
                why = "bad_priority"
            elif sel == IEEE_8021QAZ_APP_SEL_DSCP and proto > 63:
                why = "bad_dscp"
            else:
                apps.append(DCBApp(sel, prio, proto))
        if why is not None:
            skipped[why] = skipped.get(why, 0) + 1


def parse_reply(buf: bytes, *, ifname: str, seq: int | None = None) -> DCBState:
    """One reply to :func:`request`. NLMSG_ERROR becomes :class:`OSError` with the kernel's errno;
    anything malformed :class:`DCBReplyError`."""
    if len(buf) > MAX_REPLY:
        raise DCBReplyError(f"reply of {len(buf)} bytes (limit {MAX_REPLY})")
    if len(buf) < _NLMSGHDR.size:
        raise DCBReplyError(f"reply of {len(buf)} bytes is shorter than a netlink header")
    length, kind, _flags, got_seq, _pid = _NLMSGHDR.unpack_from(buf, 0)
    if length < _NLMSGHDR.size or length > len(buf):
        raise DCBReplyError(f"netlink length {length} against {len(buf)} bytes read")
    if seq is not None and got_seq != seq & 0xFFFFFFFF:
        raise DCBReplyError(f"reply to sequence {got_seq}, asked {seq}")
    if kind == NLMSG_ERROR:
        if length < _NLMSGHDR.size + 4:
            raise DCBReplyError("NLMSG_ERROR without an error code")
        (err,) = struct.unpack_from("=i", buf, _NLMSGHDR.size)
        code = -err if err < 0 else errno.EIO
        if err == 0:
            raise DCBReplyError("an acknowledgement where a DCB reply was expected")
        raise OSError(code, f"RTM_GETDCB {ifname}: {os.strerror(code)}")
    if kind != RTM_GETDCB:
        raise DCBReplyError(f"netlink message type {kind}, expected RTM_GETDCB ({RTM_GETDCB})")
    body = _NLMSGHDR.size
    if length < body + _DCBMSG.size:
        raise DCBReplyError("RTM_GETDCB reply without a dcbmsg")
    _family, cmd, _pad = _DCBMSG.unpack_from(buf, body)
    if cmd != DCB_CMD_IEEE_GET:
        raise DCBReplyError(f"dcbmsg cmd {cmd}, expected DCB_CMD_IEEE_GET ({DCB_CMD_IEEE_GET})")
    pfc_cap: int | None = None
    pfc_en: frozenset[int] | None = None
    apps: list[DCBApp] = []
    dcbx: int | None = None
    skipped: dict[str, int] = {}
    for kind_top, payload in attributes(buf, body + _DCBMSG.size, length):
        if kind_top == DCB_ATTR_IFNAME:
            name = payload.split(b"\0", 1)[0].decode("ascii", "replace")
            if name != ifname:
                raise DCBReplyError(f"reply for {name[:IFNAMSIZ]!r}, asked {ifname!r}")
        elif kind_top == DCB_ATTR_DCBX and len(payload) >= 1:
            dcbx = payload[0]
        elif kind_top == DCB_ATTR_IEEE:
            for kind_ieee, inner in attributes(payload, 0, len(payload)):
                if kind_ieee == DCB_ATTR_IEEE_PFC:
                    pfc_cap, pfc_en = _pfc(inner)
                elif kind_ieee == DCB_ATTR_IEEE_APP_TABLE:
                    _app_table(inner, apps, skipped)
    return DCBState(ifname=ifname, pfc_cap=pfc_cap, pfc_enabled=pfc_en, apps=tuple(apps), dcbx=dcbx,
                    skipped=skipped)


def parse_hex(text: str, *, ifname: str) -> DCBState:
    """The test seam's form: the reply message as hex (whitespace ignored)."""
    try:
        raw = bytes.fromhex("".join(text.split()))
    except ValueError as exc:
        raise DCBReplyError(f"not hex: {exc}") from None
    return parse_reply(raw, ifname=ifname)


_seq = 0


def query(ifname: str, *, timeout: float = TIMEOUT_S) -> DCBState:
    """DCB_CMD_IEEE_GET for ``ifname`` in this process's network namespace (the agent runs in the host's).
    OSError carries the kernel's errno (EOPNOTSUPP: no DCB ops, ENODEV: no such netdev, ETIMEDOUT)."""
    global _seq
    _seq = (_seq + 1) & 0xFFFFFFFF
    seq = _seq
    msg = request(ifname, seq)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        sock.bind((0, 0))
        sock.send(msg)
        ready, _, _ = select.select([sock], [], [], timeout)
        if not ready:
            raise OSError(errno.ETIMEDOUT, f"RTM_GETDCB {ifname}: no reply in {timeout:g} s")
        reply = sock.recv(MAX_REPLY)
    return parse_reply(reply, ifname=ifname, seq=seq)
