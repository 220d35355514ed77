"""DCB netlink (collectors/formats/dcb_netlink.py): the request against this host's real kernel, the reply
parser against replies laid out as net/dcb/dcbnl.c builds them (sim/host.py set_dcb) and against anything."""

from __future__ import annotations

import errno
import socket
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.formats import dcb_netlink as dcb
from collectors.formats.dcb_netlink import DCBReplyError
from sim.host import SimHost


def _reply(tmp_path: Path, ifname: str = "enp18s0np0", **kw: object) -> bytes:
    h = SimHost(tmp_path)
    h.set_dcb(ifname, **kw)  # type: ignore[arg-type]
    return bytes.fromhex((tmp_path / ".sim" / "dcb-ieee" / ifname).read_text())


def _netlink_or_skip() -> None:
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, dcb.NETLINK_ROUTE):
            pass
    except OSError as exc:
        pytest.skip(f"no NETLINK_ROUTE socket in this sandbox ({exc})")


# -- the real kernel ---------------------------------------------------------------------------------------

def test_kernel_answers_no_dcb_ops_for_loopback() -> None:
    """lo has no dcbnl_ops: dcb_doit answers -EOPNOTSUPP, which proves nothing alone (an unknown message type
    gets the same), so the next test tells the two apart."""
    _netlink_or_skip()
    with pytest.raises(OSError) as info:
        dcb.query("lo")
    assert info.value.errno == errno.EOPNOTSUPP


def test_kernel_routes_rtm_getdcb_to_dcbnl() -> None:
    """An unknown netdev gets -ENODEV from dcb_doit itself: RTM_GETDCB, the dcbmsg and DCB_ATTR_IFNAME were
    understood by the kernel's DCB code (a kernel without CONFIG_DCB answers -EOPNOTSUPP: skipped)."""
    _netlink_or_skip()
    with pytest.raises(OSError) as info:
        dcb.query("gnanodev0")
    if info.value.errno == errno.EOPNOTSUPP:
        pytest.skip("this kernel has no DCB netlink (CONFIG_DCB=n): RTM_GETDCB is unknown to it")
    assert info.value.errno == errno.ENODEV


def test_request_layout() -> None:
    msg = dcb.request("eth0", 7)
    length, kind, flags, seq, pid = struct.unpack_from("=IHHII", msg)
    assert (length, kind, flags, seq, pid) == (len(msg), 78, 1, 7, 0)
    assert msg[16:20] == bytes([socket.AF_UNSPEC, 21, 0, 0])
    assert msg[20:] == struct.pack("=HH", 9, 1) + b"eth0\0" + b"\0" * 3
    for bad in ("", "x" * 16, "a/b", "a b", "é", "a\n"):
        with pytest.raises(ValueError):
            dcb.request(bad, 1)


# -- replies -------------------------------------------------------------------------------------------------

def test_reply_as_dcbnl_builds_it(tmp_path: Path) -> None:
    raw = _reply(tmp_path, pfc={3}, dscp2prio={d: d >> 3 for d in range(64)}, seq=5)
    state = dcb.parse_reply(raw, ifname="enp18s0np0", seq=5)
    assert (state.pfc_cap, state.pfc_enabled, state.trust, state.dcbx_modes) == (8, frozenset({3}), "dscp",
                                                                                 ["host", "ieee"])
    assert state.dscp_map[26] == 3 and len(state.dscp_map) == 64 and not state.skipped


def test_reply_variants(tmp_path: Path) -> None:
    pcp = dcb.parse_reply(_reply(tmp_path / "a", pfc={0, 4}, dscp2prio=None, dcbx=None), ifname="enp18s0np0")
    assert (pcp.pfc_enabled, pcp.trust, pcp.dcbx, pcp.dscp_map) == (frozenset({0, 4}), "pcp", None, {})
    nopfc = dcb.parse_reply(_reply(tmp_path / "b", pfc=None), ifname="enp18s0np0")
    assert nopfc.pfc_enabled is None and nopfc.pfc_cap is None


def test_error_replies_carry_the_kernels_errno() -> None:
    req = dcb.request("eth0", 3)
    for code in (errno.EOPNOTSUPP, errno.ENODEV, errno.EPERM):
        err = struct.pack("=IHHII", 16 + 4 + len(req), dcb.NLMSG_ERROR, 0, 3, 0) + struct.pack("=i", -code) + req
        with pytest.raises(OSError) as info:
            dcb.parse_reply(err, ifname="eth0", seq=3)
        assert info.value.errno == code and not isinstance(info.value, DCBReplyError)
    ack = struct.pack("=IHHII", 20, dcb.NLMSG_ERROR, 0, 3, 0) + struct.pack("=i", 0)
    with pytest.raises(DCBReplyError):
        dcb.parse_reply(ack, ifname="eth0")


def test_replies_that_lie_or_break(tmp_path: Path) -> None:
    raw = _reply(tmp_path, pfc={3}, dscp2prio={26: 3}, seq=9)
    with pytest.raises(DCBReplyError, match="asked 'eth1'"):
        dcb.parse_reply(raw, ifname="eth1")  # an answer about another netdev
    with pytest.raises(DCBReplyError, match="sequence"):
        dcb.parse_reply(raw, ifname="enp18s0np0", seq=10)
    with pytest.raises(DCBReplyError):
        dcb.parse_reply(raw[:40], ifname="enp18s0np0")  # cut: the nlmsg length is beyond what was read
    bad = bytearray(raw)
    struct.pack_into("=H", bad, 20, 4000)  # DCB_ATTR_IFNAME claims more than the message holds
    with pytest.raises(DCBReplyError, match="beyond"):
        dcb.parse_reply(bytes(bad), ifname="enp18s0np0")
    with pytest.raises(DCBReplyError, match="not hex"):
        dcb.parse_hex("<html>", ifname="enp18s0np0")
    with pytest.raises(DCBReplyError, match="limit"):
        dcb.parse_reply(raw + bytes(dcb.MAX_REPLY), ifname="enp18s0np0")


def test_out_of_range_app_entries_are_counted(tmp_path: Path) -> None:
    h = SimHost(tmp_path)
    h.set_dcb("eth0", pfc={3}, dscp2prio={26: 3, 70: 1, 27: 9})  # DSCP 70 and priority 9 cannot exist
    state = dcb.parse_hex((tmp_path / ".sim" / "dcb-ieee" / "eth0").read_text(), ifname="eth0")
    assert state.dscp_map == {26: 3} and state.skipped == {"bad_dscp": 1, "bad_priority": 1}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_parse_or_fail_cleanly(data: bytes) -> None:
    try:
        state = dcb.parse_reply(data, ifname="eth0")
    except (DCBReplyError, OSError):
        return
    assert state.pfc_enabled is None or state.pfc_enabled <= set(range(8))
    assert len(state.apps) <= dcb.MAX_APPS and all(p <= 63 for p in state.dscp_map)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_real_layout_parses_or_fails_cleanly(tmp_path_factory: pytest.TempPathFactory,
                                                      data: st.DataObject) -> None:
    base = _reply(tmp_path_factory.mktemp("dcb"), "eth0", pfc={3}, dscp2prio={d: d >> 3 for d in range(64)})
    buf = bytearray(base)
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(buf) - 1))
        buf[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    try:
        state = dcb.parse_reply(bytes(buf[:cut]), ifname="eth0")
    except (DCBReplyError, OSError):
        return
    assert state.trust in ("dscp", "pcp")
    assert all(0 <= prio <= 7 for prio in state.dscp_map.values())
