from __future__ import annotations

import asyncio
import datetime
import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from collectors.formats.kmsg_records import (
    FellOffBus,
    ModuleError,
    NvidiaLineParser,
    PeermemError,
    SXid,
    Xid,
    iter_text_records,
    parse_record,
    parse_text_line,
)
from collectors.formats.xid_catalog import classify
from collectors.kmsg_xid import KmsgXidCollector, KmsgXidConfig
from gna_sdk.hostroot import HostRoot
from sim.host import SimHost
from tests.conftest import Sink
from tests.host_guard import REAL_KMSG, real_kmsg_allowed


def test_parse_record_device_form() -> None:
    rec = parse_record(b"4,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen"
                       b" off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n")
    assert rec is not None and (rec.prio, rec.seq, rec.usec, rec.flags) == (4, 1234, 5678901, "-")
    assert rec.level == 4 and rec.props == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}
    assert rec.message.startswith("NVRM: Xid")
    assert parse_record(b"6,1,2,-,caller=T1;escaped \\x1b[0m tab") is not None
    assert parse_record(b"6,1,2,-,caller=T1;escaped \\x41").message == "escaped A"  # type: ignore[union-attr]
    for bad in (b"", b"no header", b"a,b,c;x", b"1,2;x", b"-1,2,3,-;x"):
        assert parse_record(bad) is None


XID_LINES = [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.", "0000:3b:00.0", 79, 1234,
     "python", ""),
    ("NVRM: Xid (PCI:0000:3b:00 GPU-I:01): 94, pid=77, name=train.py, Contained ECC error.", "0000:3b:00.0", 94, 77,
     "train.py", "GPU-I:01"),
    ("NVRM: Xid (PCI:0000:b3:00 GPU-I:01 GPU-CI:02): 13, pid=5, name=a, Graphics Exception", "0000:b3:00.0", 13, 5,
     "a", "GPU-I:01 GPU-CI:02"),
    ("NVRM: Xid (PCI:0000:18:00): 95, pid='<unknown>', name=<unknown>, Uncontained ECC error.", "0000:18:00.0", 95,
     None, "<unknown>", ""),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", "0000:03:00.0", 14, None, "", ""),
    ("[ 12.3] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7",
     "0000:cb:00.0", 13, None, "<unknown>", ""),
]


@pytest.mark.parametrize(("line", "bus", "code", "pid", "proc", "mig"), XID_LINES)
def test_every_xid_format(line: str, bus: str, code: int, pid: int | None, proc: str, mig: str) -> None:
    f = NvidiaLineParser().feed(line)
    assert isinstance(f, Xid)
    assert (f.bus_id, f.code, f.pid, f.process, f.mig) == (bus, code, pid, proc, mig)


def test_fallen_off_the_bus_one_and_three_line_forms() -> None:
    p = NvidiaLineParser()
    assert p.feed("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.") == FellOffBus(
        "0000:18:00.0", "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.")
    assert p.feed("NVRM: The NVIDIA GPU 0000:b3:00.0") is None
    assert p.feed("NVRM: (PCI ID: 10de:26b5) installed in this system has") is None
    f = p.feed("NVRM: fallen off the bus and is not responding to commands.")
    assert isinstance(f, FellOffBus) and f.bus_id == "0000:b3:00.0"
    # a head line whose tail never comes is forgotten
    p.feed("NVRM: The NVIDIA GPU 0000:c3:00.0")
    for _ in range(5):
        p.feed("something else")
    assert p.feed("NVRM: fallen off the bus and is not responding to commands.") is None


def test_sxid_and_module_errors_and_harmless_lines() -> None:
    p = NvidiaLineParser()
    s = p.feed("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 30 LTSSM Fault Up")
    assert isinstance(s, SXid) and s.code == 20034 and s.fatal and s.bus_id == "0000:06:00.0"
    s = p.feed("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error")
    assert isinstance(s, SXid) and not s.fatal
    m = p.feed("nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client")
    assert m == ModuleError("nvidia_peermem", "version_mismatch", "ib_register_peer_memory_client",
                            "nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client")
    m = p.feed("nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -22)")
    assert isinstance(m, ModuleError) and m.kind == "unknown_symbol"
    m = p.feed("modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument")
    assert isinstance(m, ModuleError) and m.kind == "insert_failed" and m.module == "nvidia_peermem"
    harmless = p.feed("nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping "
                      "further processing")
    assert isinstance(harmless, PeermemError) and harmless.kind == "invalid_context"  # recognised (info, below)
    assert p.feed("EXT4-fs (vda): mounted filesystem") is None


def test_xid_catalog_never_cordons_on_application_errors() -> None:
    for code in (13, 31, 43, 45, 68):
        info = classify(code)
        assert info.application and info.action == "none" and info.severity == "warning" and not info.fatal
    assert classify(79).action == "reboot" and classify(79).fatal
    assert classify(95).nvidia_action == "RESET_GPU" and classify(95).fatal
    assert classify(48).action == "cordon"
    assert classify(63).severity == "info"
    assert classify(9999).nvidia_action == "UNKNOWN"


@given(st.binary(max_size=600))
def test_parse_record_never_crashes(data: bytes) -> None:
    rec = parse_record(data)
    if rec is not None:
        assert rec.seq >= 0 and len(rec.message) <= 4096


@given(st.lists(st.binary(max_size=120), max_size=30), st.integers(0, 10_000))
def test_text_records_never_crash_and_cut_records_wait(chunks: list[bytes], cut: int) -> None:
    data = b"\n".join(chunks)
    end = 0
    for _rec, stop in iter_text_records(data[: cut % (len(data) + 1)]):
        assert stop > end
        end = stop


@given(st.text(max_size=2000))
def test_line_parser_never_crashes(line: str) -> None:
    p = NvidiaLineParser()
    p.feed(line)
    p.feed("NVRM: Xid (" + line)
    p.feed("NVRM: The NVIDIA GPU " + line)


def test_huge_line_is_capped() -> None:
    rec = parse_record(b"4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 31, " + b"A" * 10_000_000)
    assert rec is not None and len(rec.message) == 4096
    assert rec.message.startswith("NVRM: Xid (PCI:0000:3b:00)")


def _collector(host: SimHost | Path, sink: Sink, state_dir: Path | None, tracker: ConditionTracker | None = None,
               facts: FactStore | None = None, **cfg: object) -> KmsgXidCollector:
    root = host.root if isinstance(host, SimHost) else host
    em = CollectorEmitter("n", "kmsg_xid", sink, tracker or ConditionTracker(None), facts=facts or FactStore(),
                          state_dir=state_dir)
    return KmsgXidCollector(KmsgXidConfig(**cfg), HostRoot(root), em)  # type: ignore[arg-type]


@pytest.mark.parametrize("records", [100_000, pytest.param(800_000, marks=pytest.mark.slow)])
async def test_storm_of_identical_xids_is_a_handful_of_messages(tmp_path: Path, records: int) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.set_boot("b1", uptime=60)  # the storm is the last minute: inside check's look-back
    line = b"NVRM: Xid (PCI:0000:18:00): 95, pid='<unknown>', name=<unknown>, Uncontained ECC error.\n"
    with open(host.p("/dev/kmsg"), "wb") as fh:
        fh.write(b"".join(b"3,%d,%d,-;" % (i, i * 10) + line for i in range(1, records + 1)))
    sink = Sink()
    t0 = time.perf_counter()
    await _collector(host, sink, None).check()
    elapsed = time.perf_counter() - t0
    xid = [m for m in sink.messages if m.type == "GPUXidError"]
    assert len(sink.messages) <= 5, [m.type for m in sink.messages]
    assert xid[0].details["count"] == 1 and xid[-1].details["count"] == records
    assert {m.type for m in sink.messages} == {"GPUXidError", "GPUFatalXid"}
    print(f"{records} records in {elapsed:.1f}s")


async def _run_until(c: KmsgXidCollector, done: object, settle: float = 0.2, timeout: float = 15.0) -> None:
    """Run the collector until ``done()`` holds (then a little longer, to catch extras), or fail."""
    task = asyncio.create_task(c.run())
    deadline = time.monotonic() + timeout
    try:
        while not done():  # type: ignore[operator]
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.02)
        await asyncio.sleep(settle)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_restart_neither_rereports_nor_misses_and_reboot_clears(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=2)
    state = tmp_path / "state"
    tracker = ConditionTracker(tmp_path / "conditions.json")
    host.kmsg("NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python, GPU has fallen off the bus.")
    sink = Sink()
    c = _collector(host, sink, state, tracker)
    await _run_until(c, lambda: any(m.type == "GPUFellOffBus" for m in sink.messages) and c.checkpoint)
    first = [(m.type, m.status) for m in sink.messages]
    assert ("GPUXidError", None) in first and ("GPUFellOffBus", "firing") in first
    assert ("GPUFatalXid", "firing") in first
    # restart, one new line: only the new line is reported
    host.kmsg("NVRM: Xid (PCI:0000:2a:00): 13, pid=9, name=bad.py, Graphics Exception")
    sink2 = Sink()
    c2 = _collector(host, sink2, state, ConditionTracker(tmp_path / "conditions.json"))
    await _run_until(c2, lambda: bool(sink2.messages), settle=0.5)
    assert [(m.type, m.entity) for m in sink2.messages] == [("GPUXidError", "gpu:0000:2a:00.0")]
    # reboot: a new boot id; reboot-class conditions from before resolve
    host.set_boot("00000000-0000-4000-8000-000000000002", uptime=30)
    sink3 = Sink()
    c3 = _collector(host, sink3, state, ConditionTracker(tmp_path / "conditions.json"))
    await _run_until(c3, lambda: sum(m.status == "resolved" for m in sink3.messages) >= 2)
    resolved = {(m.type, m.entity) for m in sink3.messages if m.status == "resolved"}
    assert resolved == {("GPUFellOffBus", "gpu:0000:18:00.0"), ("GPUFatalXid", "gpu:0000:18:00.0")}
    assert all(m.reason == "Rebooted" for m in sink3.messages if m.status == "resolved")


async def test_first_start_looks_back_only_the_window(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.set_boot("b1", uptime=10_000)
    host.kmsg("NVRM: Xid (PCI:0000:18:00): 31, pid=1, name=old, fault", usec=1_000_000)  # 9,999 s ago
    host.kmsg("NVRM: Xid (PCI:0000:18:00): 43, pid=2, name=new, stopped", usec=9_900 * 1_000_000)  # 100 s ago
    sink = Sink()
    c = _collector(host, sink, tmp_path / "st", lookback_seconds=600)
    await _run_until(c, lambda: bool(sink.messages), settle=0.3)
    assert [m.details["xid"] for m in sink.messages] == [43]


async def test_fatal_xid_clears_after_quiet_period(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.kmsg("NVRM: Xid (PCI:0000:18:00): 119, pid=1, name=x, GSP RPC Timeout")
    sink = Sink()
    c = _collector(host, sink, tmp_path / "st", fatal_xid_clear_after=0.5, aggregation_window=0.2)
    await _run_until(c, lambda: any(m.status == "resolved" for m in sink.messages), settle=0.1)
    fatal = [(m.status, m.reason) for m in sink.messages if m.type == "GPUFatalXid"]
    assert fatal == [("firing", "Xid119"), ("resolved", "QuietPeriodElapsed")]


async def test_module_errors_become_facts_and_events(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    for _ in range(3):
        host.kmsg("nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client")
    sink, facts = Sink(), FactStore()
    await _collector(host, sink, None, facts=facts).check()
    assert [m.type for m in sink.messages] == ["KernelModuleLoadError", "KernelModuleLoadError"]
    assert sink.messages[-1].details["count"] == 3
    assert len(facts.get("kernel.module_errors")["nvidia_peermem"]) == 3


def _kmsg_writable() -> bool:
    try:
        fd = os.open("/dev/kmsg", os.O_WRONLY)
    except OSError:
        return False
    os.close(fd)
    return True


def _kmsg_next_seq_of(marker: str, fd: int, deadline: float) -> int | None:
    """The sequence number of the first record from ``fd`` (opened before the write) holding ``marker``."""
    while time.monotonic() < deadline:
        try:
            raw = os.read(fd, 8192)
        except BlockingIOError:
            time.sleep(0.01)
            continue
        except OSError:  # EPIPE: the ring buffer overwrote what was not read yet
            continue
        rec = parse_record(raw)
        if rec is not None and marker in rec.message:
            return rec.seq
    return None


@pytest.mark.skipif(not real_kmsg_allowed(), reason=f"writes a record to the machine's kernel log: only when asked "
                    f"({REAL_KMSG}=1, as .ci/run does)")
@pytest.mark.skipif(not _kmsg_writable(), reason="/dev/kmsg is not writable here (needs root and a kernel log)")
async def test_real_dev_kmsg_record_is_read_live(tmp_path: Path) -> None:
    """The collector reads the machine's real /dev/kmsg as it grows. The record written is one no
    NVIDIA-log reader takes for a GPU event (no "NVRM", no "Xid", no driver prefix): the machine's
    kernel log, node-problem-detector, GPUd or a log alert on it are never told of a fault that is
    not there (issue 22)."""
    marker = f"gna-selftest-{os.getpid()}-{time.monotonic_ns()}"
    text = f"{marker}: gpu-node-agent test suite, kernel log reader self-test; not a hardware event"
    assert NvidiaLineParser().feed(text) is None
    assert not any(w in text.lower() for w in ("nvrm", "xid", "nvidia", "nvlink", "error", "fail"))
    sink = Sink()
    c = _collector(Path("/"), sink, tmp_path / "st", lookback_seconds=0)
    task = asyncio.create_task(c.run())
    await asyncio.sleep(0.5)  # old records are outside the zero look-back
    reader = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.lseek(reader, 0, os.SEEK_END)  # /dev/kmsg: SEEK_END is the next record to be written
        with open("/dev/kmsg", "w") as fh:
            fh.write(text + "\n")
        seq = _kmsg_next_seq_of(marker, reader, time.monotonic() + 5)
    finally:
        os.close(reader)
    assert seq is not None
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5 and (c.last_seq is None or c.last_seq < seq):
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert c.last_seq is not None and c.last_seq >= seq  # read live
    assert c.checkpoint is not None and c.checkpoint >= seq  # and its (empty) findings accepted
    assert sink.messages == []


async def test_check_looks_back_only_the_window(tmp_path: Path) -> None:
    """``check`` (the prolog's command) judges the last ``lookback_seconds`` as the daemon's first start
    does: an Xid from long ago is history, not the node's state."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.set_boot("b1", uptime=10_000)
    host.kmsg("NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=old, GPU has fallen off the bus.", usec=1_000_000)
    host.kmsg("NVRM: Xid (PCI:0000:18:00): 43, pid=2, name=new, stopped", usec=9_900 * 1_000_000)
    sink = Sink()
    await _collector(host, sink, None, lookback_seconds=600).check()
    assert [m.details["xid"] for m in sink.messages] == [43]
    sink = Sink()
    await _collector(host, sink, None, lookback_seconds=20_000).check()
    assert sorted(m.details["xid"] for m in sink.messages if "xid" in m.details) == [43, 79]


def test_a_kernel_log_line_without_a_time_is_judged_whatever_the_look_back(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.set_boot("b1", uptime=10_000)
    host.write("/dev/kmsg", "Dec  5 08:00:00 node-1 kernel: NVRM: Xid (PCI:0000:18:00): 43, pid=2, name=x, stopped\n")
    sink = Sink()
    asyncio.run(_collector(host, sink, None, lookback_seconds=600).check())
    assert [m.details["xid"] for m in sink.messages if "xid" in m.details] == [43]


# -- text renderings of the kernel log at the kmsg source ---------------------------------------
# Line shapes: util-linux dmesg (`[%5lu.%06lu] ` uptime, `-T` ctime, `-r` `<prio>` prefix) and
# journalctl -k / rsyslog (`Mon DD HH:MM:SS host kernel: `); the NVRM text as
# NVIDIA/open-gpu-kernel-modules src/nvidia/src/kernel/gpu/rc/kernel_rc.c prints it (515.43.04-565.77:
# "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s").
XID79 = "NVRM: Xid (PCI:0000:9a:00): 79, pid=1234, name=python, GPU has fallen off the bus."


@pytest.mark.parametrize("line", [
    f"[93297.027938] {XID79}",
    f"<4>[93297.027938] {XID79}",
    f"[Fri Aug 30 11:43:09 2024] {XID79}",
    f"Aug 30 11:43:09 gpu-node-07 kernel: {XID79}",
    f"Aug 30 11:43:09 gpu-node-07 kernel: [93297.027938] {XID79}",
    f"2024-08-30T11:43:09+0000 gpu-node-07 kernel: {XID79}",
])
def test_text_renderings_parse_to_the_kernel_message(line: str) -> None:
    got = parse_text_line(line.encode() + b"\n")
    assert got is not None
    _form, rec = got
    assert rec.message == XID79 and rec.seq == -1
    assert NvidiaLineParser().feed(rec.message) is not None  # an Xid finding, as from a record


@given(st.binary(max_size=300))
def test_parse_text_line_never_crashes_and_keeps_a_suffix(data: bytes) -> None:
    got = parse_text_line(data)
    if got is not None:
        _form, rec = got
        assert data.rstrip(b"\r\n").decode("utf-8", "replace").endswith(rec.message[-50:])
        assert rec.usec >= 0 and rec.prio >= 0


def _check_json(root: Path) -> dict[str, object]:
    import json
    import subprocess

    from tests.conftest import AGENT_CMD

    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(root), "--node", "n1", "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout) | {"rc": r.returncode}  # type: ignore[no-any-return]


def test_dmesg_T_text_at_the_kmsg_source_is_read_not_called_healthy(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=8)
    host.write("/dev/kmsg", "[Fri Aug 30 11:43:08 2024] nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver\n"
                            f"[Fri Aug 30 11:43:09 2024] {XID79}\n")
    report = _check_json(host.root)
    assert report["rc"] == 2
    assert any(c["type"] == "GPUFellOffBus" for c in report["conditions"])  # type: ignore[union-attr]
    assert report["unparsed"] == []


def test_a_kmsg_source_in_no_known_format_is_counted_shown_and_a_warning(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=8)
    host.write("/dev/kmsg", "".join(f"some application log line {i} with no kernel format\n" for i in range(30)))
    report = _check_json(host.root)
    assert report["rc"] == 1, report
    (u,) = report["unparsed"]  # type: ignore[misc]
    assert u["collector"] == "kmsg_xid" and u["count"] == 30 and u["sample"] == "some application log line 0 with " \
        "no kernel format"
    (cond,) = [c for c in report["conditions"] if c["type"] == "KernelLogUnparsable"]  # type: ignore[union-attr]
    assert cond["severity"] == "warning" and cond["suggested_action"] == "fix_config"


# Xid 144-150 bodies as logged on B200/GB200 (leptonai/gpud#1160 and #1174, NVIDIA/nccl#2241): the
# firmware writes "<UNIT> Fatal|Nonfatal XC0 i0 Link N (hex...)" after the open-source prefix.
async def test_xid_144_150_take_their_severity_from_their_own_fatal_field(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=2)
    host.kmsg("NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 "
              "0x00000001 0x00000000 0x00100000 0x00000004)")
    host.kmsg("NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 "
              "0x00000000 0x00000000 0x00000000)")
    host.kmsg("NVRM: Xid (PCI:0019:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 "
              "0x00000000 0x00000000 0x00000000 0x00000000)")
    sink = Sink()
    await _collector(host, sink, None).check()
    xids = {m.details["xid"]: m for m in sink.of("GPUXidError")}
    assert xids[145].severity == "warning" and xids[145].suggested_action == "none"
    assert xids[144].severity == "warning"
    assert xids[149].severity == "critical" and xids[149].suggested_action == "cordon"
    assert [m.entity for m in sink.of("GPUFatalXid")] == ["gpu:0019:01:00.0"], "only the Fatal one"
    assert classify(146).severity == "critical", "no field: the catalog's default"


async def test_a_storm_summary_states_its_true_span(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.set_boot("b1", uptime=1_400)  # the six minutes end 40 s ago: inside check's look-back
    for i in range(6):  # one Xid 13 a minute for six minutes of kernel time, read in one pass
        host.kmsg("NVRM: Xid (PCI:0000:18:00): 13, pid=77, name=python, Graphics SM Warp Exception",
                  usec=1_000_000_000 + i * 72_000_000)
    sink = Sink()
    await _collector(host, sink, None).check()
    summary = [m for m in sink.of("GPUXidError") if m.details.get("aggregated")]
    assert len(summary) == 1 and summary[0].details["count"] == 6
    assert "over 6.0 min" in summary[0].message and summary[0].details["span_s"] == 360.0


async def test_an_sxid_summary_keeps_the_severity_of_its_first(tmp_path: Path) -> None:
    """#14: the aggregated SXid summary was always warning while the first fatal SXid was critical."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.set_boot("b1", uptime=1_010)
    for i in range(5):
        host.kmsg("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
                  usec=1_000_000_000 + i * 1_000_000)
        host.kmsg("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error",
                  usec=1_000_000_000 + i * 1_000_000)
    sink = Sink()
    await _collector(host, sink, None).check()
    by = {(m.entity, bool(m.details.get("aggregated"))): m for m in sink.of("NVSwitchSXidError")}
    for agg in (False, True):
        fatal, nonfatal = by[("nvswitch:0000:06:00.0", agg)], by[("nvswitch:0000:05:00.0", agg)]
        assert (fatal.severity, fatal.suggested_action) == ("critical", "inspect_hardware")
        assert (nonfatal.severity, nonfatal.suggested_action) == ("warning", "none")
    assert by[("nvswitch:0000:06:00.0", True)].details["count"] == 5


@pytest.mark.parametrize(("line", "kind"), [
    # 515-545: "nvidia-peermem %s:%d " FMT (open-gpu-kernel-modules kernel-open/nvidia-peermem/nvidia-peermem.c)
    ("nvidia-peermem nv_get_p2p_free_callback:101 nv_get_p2p_free_callback -- invalid nv_mem_context",
     "invalid_context"),
    # 535.129.03+, 550+, 560+: " ERROR " inserted; line 127 as observed in leptonai/gpud#46
    ("nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
     "invalid_context"),
    ("nvidia-peermem nv_mem_client_init:410 ERROR nv_mem_client_init -- error while registering traditional client",
     "registration_failed"),
    ("nvidia-peermem nv_dma_map:260 ERROR nv_dma_map -- error -22 while calling nvidia_p2p_dma_map_pages()",
     "p2p_error"),
])
def test_nvidia_peermem_errors_are_recognised(line: str, kind: str) -> None:
    f = NvidiaLineParser().feed(line)
    assert isinstance(f, PeermemError) and f.kind == kind


async def test_peermem_invalid_context_and_a_570_xid_79_without_pid(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=2)
    host.kmsg("nvidia-peermem nv_get_p2p_free_callback:132 ERROR detected invalid context, skipping further "
              "processing", prio=3)
    host.kmsg("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.")  # 570.86.15+: no pid/name
    sink = Sink()
    await _collector(host, sink, None).check()
    (pm,) = sink.of("NvidiaPeermemError")
    assert pm.severity == "info" and pm.reason == "KnownHarmless" and pm.entity == "module:nvidia_peermem"
    assert pm.details["harmless"] is True and pm.details["fixed_in"] == "R560" and "harmless" in pm.message
    assert [m.entity for m in sink.of("GPUFellOffBus")] == ["gpu:0000:44:00.0"]


def test_bare_nvidia_lines_and_older_fallen_off_wording() -> None:
    # pasted without any prefix (NVIDIA/open-gpu-kernel-modules#1151 quotes Xid 79 this way on 570+)
    got = parse_text_line(b"NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.\n")
    assert got is not None and got[0] == "bare NVIDIA line"
    assert parse_text_line(b"some application line\n") is None, "other bare text stays unparsed"
    p = NvidiaLineParser()
    # a synthetic variant (no source: closed pre-515 drivers cannot be read) for the generic fallback that
    # takes any NVRM line naming a GPU and "fallen off the bus"
    f = p.feed("NVRM: GPU at 0000:02:00.0 has fallen off the bus.")
    assert isinstance(f, FellOffBus) and f.bus_id == "0000:02:00.0"
    assert p.feed("NVRM: GPU at PCI:0000:01:00: GPU-bc0fa0b9-1b1e-2c3d-4e5f-60718293a4b5") is None


async def test_a_kernel_finding_says_when_the_kernel_logged_it(tmp_path: Path) -> None:
    """Issue 22: evidence times were when a check read the log; a record's own time is the boot's wall
    time (/proc/stat btime) plus its uptime stamp."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.set_boot("b1", uptime=10_000)
    host.kmsg("NVRM: Xid (PCI:0000:18:00): 79, pid=2, name=x, GPU has fallen off the bus.", usec=9_900 * 1_000_000)
    sink = Sink()
    await _collector(host, sink, None, lookback_seconds=600).check()
    stamped = {m.type: m.details.get("logged_at") for m in sink.messages}
    assert stamped.keys() >= {"GPUXidError", "GPUFellOffBus"}
    for type_ in ("GPUXidError", "GPUFellOffBus"):
        at = datetime.datetime.fromisoformat(str(stamped[type_]).replace("Z", "+00:00")).timestamp()
        assert abs(at - (time.time() - 100)) < 5, (type_, stamped[type_])
    host.write("/proc/stat", "cpu  0 0 0 0\n")  # no btime: no time made up
    sink = Sink()
    await _collector(host, sink, None, lookback_seconds=600).check()
    assert all("logged_at" not in m.details for m in sink.messages)
