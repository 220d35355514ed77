"""NVML checks of use and set-up (docs/nvml-checks.md): busy-but-waiting GPUs, MIG against the device plugin's
strategy, P2P of GPU pairs that should have it (with ACS as the likely cause). The fake is tests/fake_nvml.py's,
extended here with the calls these checks make."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from agent.message import to_dict
from collectors.formats import gfd_labels
from collectors.formats.pci_acs import AcsState, parse_acs
from collectors.nvml import NVMLCollector, NVMLConfig
from collectors.shared.device_plugin import parse_mig_strategy
from gna_sdk.hostroot import HostRoot
from gna_types.policy import verdict
from sim.topology import PCIE_GPUS, pcie_8gpu
from tests.conftest import Sink, validate_message
from tests.fake_nvml import NVML_ERROR_INVALID_ARGUMENT, FakeGPU, FakeNVML, NVMLError

NVML_ERROR_NOT_FOUND = 6


class ChecksNVML(FakeNVML):
    def __init__(self, gpus: list[FakeGPU], *, p2p: dict[tuple[int, int], int] | None = None,
                 migs: dict[int, list[tuple[int, int]]] | None = None) -> None:
        super().__init__(gpus)
        self.p2p = p2p or {}  # (i, j) -> status for every caps index
        self.migs = migs or {}  # GPU -> [(gpuInstanceSliceCount, memorySizeMB)] of its MIG devices

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        self._gpu(a), self._gpu(b)
        return int(self.p2p.get((min(a, b), max(a, b)), pynvml.NVML_P2P_STATUS_OK))

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        self._gpu(h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, i: int) -> Any:
        devs = self.migs.get(h, [])
        if i >= 7:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if i >= len(devs):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return ("mig", h, i)

    def nvmlDeviceGetAttributes(self, mh: Any) -> Any:
        gi, mem = self.migs[mh[1]][mh[2]]
        return SimpleNamespace(gpuInstanceSliceCount=gi, memorySizeMB=mem)


def _collector(fake: FakeNVML, sink: Sink, root: str = "/nonexistent", clock: Any = None,
               **cfg: object) -> NVMLCollector:
    em = CollectorEmitter("n", "nvml", sink, ConditionTracker(None), facts=FactStore())
    return NVMLCollector(NVMLConfig(**cfg), HostRoot(root), em, nvml=fake, clock=clock)  # type: ignore[arg-type]


def _checked(sink: Sink) -> None:
    for m in sink.messages:
        validate_message(to_dict(m))
        v = verdict(m.type, m.reason)
        assert (m.severity, m.suggested_action) == (v.severity, v.action)


# -- busy but waiting --------------------------------------------------------------------------------------------

async def _run_gpm(readings: dict[int, float] | None, passes: int) -> Sink:
    gpus = [FakeGPU("00000000:18:00.0", nvlinks=[])]
    if readings is not None:
        gpus[0].gpm = {**(gpus[0].gpm or {}), **readings}
    else:
        gpus[0].gpm = {}
    t = [0.0]
    sink = Sink()
    c = _collector(ChecksNVML(gpus), sink, clock=lambda: t[0], p2p=False, tensor_idle_window=120.0)
    for _ in range(passes):
        sink.messages.clear()
        await c.collect()
        t[0] += 30.0
    return sink


async def test_sm_busy_tensor_idle_sustained_is_a_warning_on_the_gpu() -> None:
    waiting = {pynvml.NVML_GPM_METRIC_SM_UTIL: 95.0, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 2.0}
    assert [m.type for m in (await _run_gpm(waiting, 4)).messages] == []  # 3 samples: 90 s < 120 s
    sink = await _run_gpm(waiting, 5)
    assert [(m.type, m.entity, m.reason) for m in sink.messages] == [
        ("GPUTensorPipeIdle", "gpu:0000:18:00.0", "SMBusyTensorIdle")]
    assert sink.messages[0].details["held_s"] == 120.0
    _checked(sink)


async def test_tensor_busy_and_idle_gpus_stay_clean() -> None:
    assert (await _run_gpm(None, 8)).messages == []  # BUSY_GPM: SM 91.5 %, tensor 47 %
    idle = {pynvml.NVML_GPM_METRIC_SM_UTIL: 0.0, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.0}
    assert (await _run_gpm(idle, 8)).messages == []
    assert (await _run_gpm({}, 8)).messages == []  # no GPM readings at all


# -- MIG and the device plugin ------------------------------------------------------------------------------------

def _plugin(root: Path, argv: list[str], env: list[str] = ()) -> None:  # type: ignore[assignment]
    d = root / "proc" / "4242"
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "environ").write_bytes(b"\0".join(e.encode() for e in env) + b"\0")


async def _mig(root: Path, migs: dict[int, list[tuple[int, int]]], modes: list[int], **cfg: object) -> Sink:
    gpus = [FakeGPU(f"00000000:{b}:00.0", nvlinks=[], mig=(m, m)) for b, m in zip(("18", "2A"), modes, strict=False)]
    sink = Sink()
    await _collector(ChecksNVML(gpus, migs=migs), sink, str(root), p2p=False, **cfg).collect()
    _checked(sink)
    return sink


async def test_mig_findings_against_the_plugins_strategy(tmp_path: Path) -> None:
    _plugin(tmp_path, ["/usr/bin/nvidia-device-plugin", "--mig-strategy", "single"])
    got = await _mig(tmp_path, {0: [(1, 10240), (3, 40192)], 1: [(1, 10240)]}, [1, 1])
    assert {(m.entity, m.reason) for m in got.messages} == {
        ("gpu:0000:18:00.0", "MixedProfilesUnderSingle"), ("gpu:0000:2a:00.0", "MixedProfilesUnderSingle")}
    assert got.messages[0].details["plugin_pid"] == 4242
    got = await _mig(tmp_path, {0: [(1, 10240)]}, [1, 0])
    assert {m.reason for m in got.messages} == {"MIGDisabledGPUUnderSingle"}
    got = await _mig(tmp_path, {0: [(1, 10240)]}, [1, 1])
    assert {(m.entity, m.reason) for m in got.messages} == {("gpu:0000:2a:00.0", "NoMIGDevices")}
    got = await _mig(tmp_path / "none", {0: [(1, 10240)]}, [1, 0], mig_strategy="none")
    assert {m.reason for m in got.messages} == {"StrategyNoneWithMIG"}
    assert got.messages[0].details["strategy_source"] == "config"


async def test_mig_healthy_layouts_stay_clean(tmp_path: Path) -> None:
    _plugin(tmp_path, ["/usr/bin/nvidia-device-plugin"], ["MIG_STRATEGY=mixed"])
    assert (await _mig(tmp_path, {0: [(1, 10240), (3, 40192)]}, [1, 0])).messages == []
    assert (await _mig(tmp_path / "x", {0: [(1, 10240)], 1: [(1, 10240)]}, [1, 1],
                       mig_strategy="single")).messages == []
    assert (await _mig(tmp_path / "y", {}, [0, 0])).messages == []  # no MIG: nothing asked of the plugin


def _gfd(root: Path, text: str) -> None:
    """GFD's feature file as internal/lm/output.go writes it: one key=value line per label."""
    path = root / gfd_labels.DEFAULT_PATH.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# GFD v0.20.0's labels of a 2-GPU A100 node, one GPU in MIG mode (internal/lm: resource.go product/count, mig-strategy.go)
GFD_MIXED = ("nvidia.com/gfd.timestamp=1765000000\nnvidia.com/gpu.count=2\nnvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB\n"
             "nvidia.com/mig.capable=true\nnvidia.com/mig.strategy=mixed\nnvidia.com/mig-1g.10gb.count=1\n"
             "nvidia.com/mig-3g.40gb.count=1\nnvidia.com/mig-1g.10gb.memory=9984\n")


async def test_gfd_labels_against_the_plugin_and_nvml(tmp_path: Path) -> None:
    """GPU Feature Discovery's labels: a strategy other than the plugin's, or another count of MIG devices than NVML
    shows, for longer than gfd_grace; agreeing labels, and no file at all, stay clean."""
    layout = {0: [(1, 10240), (3, 40192)]}
    _plugin(tmp_path, ["/usr/bin/nvidia-device-plugin"], ["MIG_STRATEGY=mixed"])
    assert (await _mig(tmp_path, layout, [1, 0], gfd_grace=0.0)).messages == []  # no GFD file: nothing to compare
    _gfd(tmp_path, GFD_MIXED)
    assert (await _mig(tmp_path, layout, [1, 0], gfd_grace=0.0)).messages == []  # 2 MIG devices, mixed: agree
    _gfd(tmp_path, GFD_MIXED.replace("mig.strategy=mixed", "mig.strategy=single"))
    got = await _mig(tmp_path, layout, [1, 0], gfd_grace=0.0)
    assert [(m.entity, m.reason, m.severity) for m in got.messages] == [
        ("gpu:0000:18:00.0", "GFDStrategyDiffers", "warning")]
    d = got.messages[0].details
    assert d["gfd_strategy"] == "single" and d["strategy"] == "mixed" and "k8s-device-plugin" in d["citation"]
    _gfd(tmp_path, GFD_MIXED.replace("mig-3g.40gb.count=1", "mig-3g.40gb.count=2"))  # a layout of before
    got = await _mig(tmp_path, layout, [1, 0], gfd_grace=0.0)
    assert [m.reason for m in got.messages] == ["GFDMIGCountDiffers"] and got.messages[0].details["gfd_mig_devices"] == 3
    # GFD under "none" writes no mig.strategy label at all: against a mixed plugin that differs
    _gfd(tmp_path, "nvidia.com/gpu.count=2\nnvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB\n")
    assert [m.reason for m in (await _mig(tmp_path, layout, [1, 0], gfd_grace=0.0)).messages] == ["GFDStrategyDiffers"]


async def test_gfd_disagreement_must_last_the_grace(tmp_path: Path) -> None:
    """GFD relabels every 60 s by default: a layout just changed is not a finding until gfd_grace has passed."""
    now = [1000.0]
    _plugin(tmp_path, ["/usr/bin/nvidia-device-plugin", "--mig-strategy=mixed"])
    _gfd(tmp_path, GFD_MIXED.replace("mig-3g.40gb.count=1", "mig-3g.40gb.count=2"))
    gpus = [FakeGPU("00000000:18:00.0", nvlinks=[], mig=(1, 1))]
    sink = Sink()
    c = _collector(ChecksNVML(gpus, migs={0: [(1, 10240), (3, 40192)]}), sink, str(tmp_path), clock=lambda: now[0],
                   p2p=False, gfd_grace=180.0)
    await c.collect()
    now[0] += 120
    await c.collect()
    mig = [m for m in sink.messages if m.type == "GPUMIGMisconfigured"]
    assert mig == []
    now[0] += 61
    await c.collect()
    assert [m.reason for m in sink.messages if m.type == "GPUMIGMisconfigured"] == ["GFDMIGCountDiffers"]


def test_gfd_label_file_parse() -> None:
    got = gfd_labels.parse(GFD_MIXED + "# a comment\n\nnot a label\n" + "x" * 400 + "=1\nnvidia.com/k=" + "v" * 64)
    assert got.strategy == "mixed" and got.mig_devices() == 2 and got.unparsed == 3
    single = gfd_labels.parse("nvidia.com/mig.strategy=single\nnvidia.com/gpu.count=7\n")
    assert single.mig_devices() == 7
    invalid = gfd_labels.parse("nvidia.com/mig.strategy=single\nnvidia.com/gpu.count=0\n"
                               "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB-MIG-INVALID\n")
    assert invalid.invalid_single and invalid.mig_devices() is None
    assert gfd_labels.parse("nvidia.com/gpu.count=8\n").strategy == "none"
    assert gfd_labels.parse("nvidia.com/mig.strategy=mixed\nnvidia.com/mig-1g.10gb.count=x\n").mig_devices() is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=4096))
def test_gfd_label_parser_never_raises_and_keeps_bounds(text: str) -> None:
    got = gfd_labels.parse(text)
    assert len(got.labels) <= gfd_labels.MAX_LABELS
    assert all(len(k) <= gfd_labels.MAX_NAME and len(v) <= gfd_labels.MAX_VALUE for k, v in got.labels.items())
    assert got.mig_devices() is None or got.mig_devices() >= 0  # type: ignore[operator]


def test_mig_strategy_from_cmdline_and_environ() -> None:
    assert parse_mig_strategy(b"nvidia-device-plugin\0--mig-strategy=mixed\0") == "mixed"
    assert parse_mig_strategy(b"nvidia-device-plugin\0", b"MIG_STRATEGY=single\0") == "single"
    assert parse_mig_strategy(b"p\0-mig-strategy\0none\0", b"MIG_STRATEGY=single\0") == "none"
    assert parse_mig_strategy(b"p\0--fail-on-init-error=false\0") is None


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=2048), st.one_of(st.none(), st.binary(max_size=512)))
def test_mig_strategy_parser_never_raises(cmdline: bytes, environ: bytes | None) -> None:
    got = parse_mig_strategy(cmdline, environ)
    assert got is None or len(got) <= 32


# -- P2P and ACS ------------------------------------------------------------------------------------------------

def _config(acs_ctrl: int | None) -> bytes:
    cfg = bytearray(4096)
    # AER (0x0001) at 0x100 -> ACS (0x000d) at 0x148, as a PLX/Broadcom downstream port lists them
    cfg[0x100:0x104] = (0x0001 | 1 << 16 | 0x148 << 20).to_bytes(4, "little")
    if acs_ctrl is not None:
        cfg[0x148:0x14C] = (0x000D | 1 << 16).to_bytes(4, "little")
        cfg[0x14C:0x14E] = (0x5F).to_bytes(2, "little")
        cfg[0x14E:0x150] = acs_ctrl.to_bytes(2, "little")
    return bytes(cfg)


async def _p2p(tmp_path: Path, p2p: dict[tuple[int, int], int], acs_ctrl: int | None) -> Sink:
    host, b = pcie_8gpu(tmp_path)
    for bdf, fn in b.functions.items():
        host.p(f"{fn.real}/config").write_bytes(_config(acs_ctrl if bdf not in PCIE_GPUS else None))
    gpus = [FakeGPU("00000000:" + g[5:].upper(), nvlinks=[]) for g in PCIE_GPUS[:4]]
    sink = Sink()
    await _collector(ChecksNVML(gpus, p2p=p2p), sink, str(tmp_path), gpm=False).collect()
    _checked(sink)
    return sink


async def test_p2p_missing_under_one_switch_names_acs(tmp_path: Path) -> None:
    sink = await _p2p(tmp_path / "a", {(0, 1): pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED}, 0x1D)
    assert [(m.type, m.reason) for m in sink.messages] == [("GPUP2PUnavailable", "ACSRedirect")]
    d = sink.messages[0].details
    assert d["distance"] == "PIX" and d["status"] == {"read": "CHIPSET_NOT_SUPPORTED",
                                                       "write": "CHIPSET_NOT_SUPPORTED"}
    assert d["acs_redirect"] and "p2p_request_redirect" in d["acs_redirect"][0]["enabled"]
    sink = await _p2p(tmp_path / "b", {(0, 1): pynvml.NVML_P2P_STATUS_GPU_NOT_SUPPORTED}, 0x0)
    assert [(m.type, m.reason) for m in sink.messages] == [("GPUP2PUnavailable", "P2PNotSupported")]


async def test_p2p_healthy_pairs_stay_clean(tmp_path: Path) -> None:
    assert (await _p2p(tmp_path / "a", {}, 0x1D)).messages == []  # P2P OK: ACS alone is no finding
    # a pair across the root complex (different sockets' trees) is not expected to have P2P
    sink = Sink()
    pcie_8gpu(tmp_path / "b")
    gpus = [FakeGPU("00000000:" + g[5:].upper(), nvlinks=[]) for g in (PCIE_GPUS[0], PCIE_GPUS[7])]
    await _collector(ChecksNVML(gpus, p2p={(0, 1): 3}), sink, str(tmp_path / "b"), gpm=False).collect()
    assert sink.messages == []


def test_acs_parser_reads_the_chain() -> None:
    acs = parse_acs(_config(0x1D))
    assert isinstance(acs, AcsState) and acs.offset == 0x148 and acs.redirects_p2p
    assert parse_acs(_config(None)) is None
    assert parse_acs(_config(0x1D)[:64]) is False  # an unprivileged read: unknown


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 4095), st.binary(min_size=4, max_size=4))
def test_acs_parser_never_raises(head: bytes, at: int, word: bytes) -> None:
    cfg = bytearray(_config(0x1D))
    cfg[at:at + 4] = word
    cfg[0x100:0x100 + len(head)] = head
    got = parse_acs(bytes(cfg[:4096]))
    assert got is None or got is False or (isinstance(got, AcsState) and 0x100 <= got.offset < 4096)
