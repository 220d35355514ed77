"""Issue 26: dead GPUs and fatal PCIe errors the kernel log shows without an Xid line -- NVRM's GSP-RM failure lines
(collectors/formats/kmsg_records.py parse_gsp) and the kernel's PCIe AER lines (parse_aer), raised by
collectors/kmsg_xid.py as GPUGSPTimeout and GPUPCIeAERError on the GPU, graded by gna_types/policy.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from collectors.formats.kmsg_records import AerLine, GspEvent, NvidiaLineParser, parse_aer, parse_gsp, parse_text_line
from collectors.kmsg_xid import KmsgXidCollector, KmsgXidConfig
from gna_sdk.hostroot import HostRoot
from gna_types.policy import verdict
from sim.host import SimHost
from tests.conftest import Sink

MINE = ("GPUGSPTimeout", "GPUPCIeAERError")


def _collector(host: SimHost, sink: Sink) -> KmsgXidCollector:
    em = CollectorEmitter("n", "kmsg_xid", sink, ConditionTracker(None), facts=FactStore(), state_dir=None)
    return KmsgXidCollector(KmsgXidConfig(), HostRoot(host.root), em)


async def _check(host: SimHost, *lines: str) -> Sink:
    for line in lines:
        host.kmsg(line)
    sink = Sink()
    await _collector(host, sink).check()
    return sink


@pytest.mark.parametrize(("line", "kind", "instance", "bus"), [
    # 595.45.04 kernel_gsp.c, as printed in NVIDIA/open-gpu-kernel-modules#1230 (595.71.05)
    ("NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 812751949 heartbeat 1899482 "
     "heartbeatWithOffsetMs 812745879 diff 6070 timeout 5200", "heartbeat", 6, ""),
    ("NVRM: GPU6 kgmmuCheckMemSubsysError_IMPL: Memory Subsystem Error detected. kbusSendSysmembarSingle failed.",
     "memsys", 6, ""),
    ("NVRM: GPU6 _kgspLogRpcTimeout: ********************************* GSP Timeout "
     "**********************************", "timeout", 6, ""),
    ("NVRM: GPU0 _kgspClassifyGspTimeout: ================ GSP core unresponsive ===============", "unresponsive",
     0, ""),
    # 595.44.02 _kgspRpcRecvPoll; older drivers print no GPU instance (NVIDIA/open-gpu-kernel-modules#1125)
    ("NVRM: _kgspRpcRecvPoll: GSP RM heartbeat timed out", "heartbeat", None, ""),
    ("NVRM: _kgspLogXid119: ********************************* GSP Timeout **********************************",
     "timeout", None, ""),
    ("NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of every 30).  The GPU likely "
     "needs to be reset.", "rate_limited", None, "0000:9b:00.0"),
])
def test_gsp_lines(line: str, kind: str, instance: int | None, bus: str) -> None:
    f = NvidiaLineParser().feed(line)
    assert isinstance(f, GspEvent) and (f.kind, f.instance, f.bus_id) == (kind, instance, bus)


@pytest.mark.parametrize("line", [
    "NVRM: GPU4 GSP RPC buffer contains function 103 (GSP_RM_ALLOC) and data 0x0000000000002081 0x0000000000000004.",
    "NVRM:     -1    4124 GSP_LOCKDOWN_NOTICE   0x0000000000000000 0x0000000000000000 0x00062e099220bc3a",
    "NVRM: GPU0 _kgspIsHeartbeatTimedOut: Heartbeat not timed out, currentTimeMs 1 heartbeat 1 heartbeatWithOffsetMs 1",
    "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  595.71.05  Release Build  (root@epyc)",
])
def test_informational_gsp_lines_are_not_findings(line: str) -> None:
    assert NvidiaLineParser().feed(line) is None


@pytest.mark.parametrize(("line", "want"), [
    # aer.c aer_print_port_info: v6.16+ wording, the v6.x severities, the v5.x ones, a pre-v5 "id=" source
    ("pcieport 0000:00:03.1: AER: Correctable error message received from 0000:00:00.0",
     ("pcieport", "0000:00:03.1", "received", "correctable", "0000:00:00.0")),
    ("pcieport 0000:00:01.0: AER: Uncorrectable (Fatal) error message received from 0000:03:00.0",
     ("pcieport", "0000:00:01.0", "received", "fatal", "0000:03:00.0")),
    ("pcieport 0000:00:03.0: AER: Multiple Uncorrected (Fatal) error received: 0000:00:03.0",
     ("pcieport", "0000:00:03.0", "received", "fatal", "0000:00:03.0")),
    ("pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010",
     ("pcieport", "0000:00:02.0", "received", "fatal", "")),
    ("pcieport 0000:00:1c.0: AER: Uncorrected (Non-Fatal) error received: 0000:03:01.0",
     ("pcieport", "0000:00:1c.0", "received", "nonfatal", "0000:03:01.0")),
    # aer_print_error, with and without the "AER: " dev_fmt
    ("nvidia 0000:03:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Transaction Layer, (Requester ID)",
     ("nvidia", "0000:03:00.0", "bus_error", "fatal", "")),
    ("pcieport 0000:00:01.1: AER: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Receiver ID)",
     ("pcieport", "0000:00:01.1", "bus_error", "correctable", "")),
    # err.c: report_error_detected (current, v5.x capitalised, v4.x wording), pcie_do_recovery
    ("nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)",
     ("nvidia", "0000:03:00.0", "cant_recover", "", "")),
    ("nvidia 0000:63:00.0: AER: Can't recover (no error_detected callback)",
     ("nvidia", "0000:63:00.0", "cant_recover", "", "")),
    ("nvidia 0000:02:00.0: device has no AER-aware driver", ("nvidia", "0000:02:00.0", "cant_recover", "", "")),
    ("pcieport 0000:00:03.0: AER: device recovery failed", ("pcieport", "0000:00:03.0", "recovery_failed", "", "")),
    ("pcieport 0000:00:03.0: AER: Device recovery successful",
     ("pcieport", "0000:00:03.0", "recovery_successful", "", "")),
])
def test_aer_lines(line: str, want: tuple[str, str, str, str, str]) -> None:
    f = NvidiaLineParser().feed(line)
    assert isinstance(f, AerLine) and (f.driver, f.device, f.kind, f.severity, f.source) == want


def test_dmesg_reltime_rendering() -> None:
    # util-linux dmesg -H: "[  %+8.06f] " between lines, "[%b%e %H:%M] " at a new minute
    for raw in (b"[  +0.000844] nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)\n",
                b"[Jan21 10:00] nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)\n",
                b"[Jan 1 10:00] nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)\n"):
        got = parse_text_line(raw)
        assert got is not None and got[0] == "dmesg -H" and got[1].usec == 0
        assert got[1].message.startswith("nvidia 0000:03:00.0")


_PIECES = st.sampled_from(["NVRM: ", "GPU6 ", "GPU99999 ", "GSP", " Timeout ", "*" * 9, "=" * 9, " unresponsive ",
                           "Heartbeat timed out, currentTimeMs 1", "Memory Subsystem Error detected.", "PCI:",
                           "0000:9b:00", "needs to be reset", "AER: ", "nvidia ", "pcieport ", "0000:00:03.0: ",
                           "PCIe Bus Error: severity=", "Uncorrected (Fatal)", "Correctable", " error received: ",
                           "message received from ", "id=", "can't recover (no error_detected callback)",
                           "device recovery failed", "\x00", "é", " "])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_PIECES, st.text(max_size=40)), max_size=30))
def test_gsp_and_aer_parsers_never_raise_and_stay_bounded(parts: list[str]) -> None:
    line = "".join(parts)
    for f in (parse_gsp(line), parse_aer(line), NvidiaLineParser().feed(line)):
        if isinstance(f, GspEvent | AerLine):
            assert len(f.text) <= 500
        if isinstance(f, GspEvent):
            assert f.instance is None or 0 <= f.instance <= 9999
        if isinstance(f, AerLine):
            assert len(f.driver) <= 32 and len(f.device) <= 16


# -- the collector ------------------------------------------------------------------------------------------

async def test_gsp_timeout_without_xid_is_critical_on_the_gpu_in_pci_order(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=2)
    sink = await _check(
        host,
        "NVRM: GPU1 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 812751949 heartbeat 1899482 "
        "heartbeatWithOffsetMs 812745879 diff 6070 timeout 5200",
        "NVRM: GPU1 kgmmuCheckMemSubsysError_IMPL: Memory Subsystem Error detected. kbusSendSysmembarSingle failed.",
        "NVRM: GPU1 _kgspLogRpcTimeout: ********************************* GSP Timeout "
        "**********************************")
    got = sink.of("GPUGSPTimeout")
    assert {m.entity for m in got} == {"gpu:0000:2a:00.0"}  # RM's GPU1: the second GPU by bus id
    first, last = got[0], got[-1]
    assert (first.severity, first.reason) == ("warning", "HeartbeatTimedOut")
    # critical from the memory-subsystem line on (the emitter publishes a condition again when its grade changes)
    v = verdict("GPUGSPTimeout", last.reason)
    assert (last.severity, last.suggested_action) == (v.severity, v.action) == ("critical", "cordon")
    assert last.details["kinds"][:2] == ["heartbeat", "memsys"] and last.details["gpu_from"] == "pci_order"
    assert not sink.of("GPUXidError")


async def test_gsp_instance_learnt_from_an_xid_line_wins(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=8)
    sink = await _check(
        host,
        "NVRM: Xid (PCI:0000:18:00): 119, pid=1, name=nvidia-smi, Timeout after 6s of waiting for RPC response from "
        "GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
        "NVRM: GPU4 _kgspLogRpcTimeout: ********************************* GSP Timeout "
        "**********************************")
    (m,) = sink.of("GPUGSPTimeout")
    assert m.entity == "gpu:0000:18:00.0" and m.details["gpu_from"] == "log" and m.details["gpu_instance"] == 4


async def test_a_heartbeat_alone_is_a_warning_and_informational_gsp_lines_stay_clean(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    sink = await _check(host, "NVRM: _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 3856513292 "
                              "heartbeat 0 heartbeatWithOffsetMs 0 diff 3856513292 timeout 5200",
                        "NVRM: _kgspRpcRecvPoll: GSP RM heartbeat timed out", "PM: suspend exit")
    assert not sink.of("GPUGSPTimeout"), "no GPU instance printed: no GPU to name"
    host = SimHost.gpu_node(tmp_path / "h2", gpus=1)
    sink = await _check(host, "NVRM: GPU0 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 3 heartbeat 0 "
                              "heartbeatWithOffsetMs 0 diff 3 timeout 5200",
                        "NVRM: GPU0 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 4 heartbeat 0 "
                        "heartbeatWithOffsetMs 0 diff 4 timeout 5200")
    (m,) = sink.of("GPUGSPTimeout")
    assert (m.severity, m.suggested_action, m.reason) == ("warning", "none", "HeartbeatTimedOut")
    host = SimHost.gpu_node(tmp_path / "h3", gpus=1)
    sink = await _check(host, "NVRM: GPU0 GSP RPC buffer contains function 103 (GSP_RM_ALLOC) and data 0x1 0x4.",
                        "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  595.71.05  Release Build")
    assert not [m for m in sink.messages if m.type in MINE]


async def test_fatal_aer_on_the_root_port_names_the_gpu_below_and_a_failed_recovery_is_critical(
        tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=2)  # GPU0 0000:18:00.0 below root port 0000:14:01.0
    sink = await _check(
        host,
        "pcieport 0000:14:01.0: AER: Uncorrectable (Fatal) error message received from 0000:14:01.0",
        "pcieport 0000:14:01.0: AER: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Transaction Layer, "
        "(Requester ID)",
        "pcieport 0000:14:01.0: AER: device recovery failed")
    got = sink.of("GPUPCIeAERError")
    assert {m.entity for m in got} == {"gpu:0000:18:00.0"}, "only the GPU below the port"
    assert (got[0].severity, got[0].suggested_action) == ("warning", "inspect_hardware")
    assert (got[-1].severity, got[-1].suggested_action, got[-1].reason) == ("critical", "reboot", "RecoveryFailed")
    assert got[-1].details["kinds"] == ["received", "bus_error", "recovery_failed"] and got[-1].details["severity"] == "fatal"


async def test_aer_healthy_counterparts_stay_clean(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1, hcas=1)  # mlx5_0 0000:17:00.0 below 0000:16:00.0
    sink = await _check(
        host,
        "pcieport 0000:14:01.0: AER: Correctable error message received from 0000:18:00.0",
        "nvidia 0000:18:00.0: AER: PCIe Bus Error: severity=Correctable, type=Data Link Layer, (Receiver ID)",
        "pcieport 0000:14:01.0: AER: Uncorrectable (Non-Fatal) error message received from 0000:18:00.0",
        "pcieport 0000:14:01.0: AER: device recovery successful",
        # the NIC's own port: a fatal error and a failed recovery below a port with no GPU are not a GPU's
        "pcieport 0000:16:00.0: AER: Uncorrectable (Fatal) error message received from 0000:17:00.0",
        "mlx5_core 0000:17:00.0: AER: can't recover (no error_detected callback)",
        "pcieport 0000:16:00.0: AER: device recovery failed")
    assert not [m for m in sink.messages if m.type in MINE], [(m.type, m.entity) for m in sink.messages]


async def test_a_gpus_own_cant_recover_names_it_and_an_unknown_port_is_named_itself(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    sink = await _check(host, "nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)",
                        "pcieport 0000:00:03.0: AER: device recovery failed")
    assert {(m.entity, m.severity) for m in sink.of("GPUPCIeAERError")} == {("gpu:0000:03:00.0", "critical")}
    host = SimHost.gpu_node(tmp_path / "h2", gpus=1)
    sink = await _check(host, "pcieport 0000:00:03.0: AER: device recovery failed")
    assert [(m.entity, m.reason) for m in sink.of("GPUPCIeAERError")] == [("pci:0000:00:03.0", "RecoveryFailed")]


async def test_healthy_kernel_corpus_cases_raise_neither(tmp_path: Path) -> None:
    corpus = Path(__file__).parent / "corpus" / "kernel"
    for case in sorted(corpus.glob("*-healthy-*")):
        host = SimHost.gpu_node(tmp_path / case.name, gpus=8)
        host.p("/dev/kmsg").write_bytes((case / "input.log").read_bytes())
        sink = Sink()
        await _collector(host, sink).check()
        assert not [m for m in sink.messages if m.type in MINE], case.name
