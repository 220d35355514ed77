"""Node topology (collectors/topology.py, sim/topology.py, gpu-node-agent topo).

Expected matrices are what nvidia-smi printed on the real hardware each simulated tree copies:

- DGX/HGX H100 layout, ``nvidia-smi topo -m``: kvcache-ai/Mooncake#2039 (8x H100 NVSwitch, mlx5_0..11 with
  the DGX H100 user guide's GPU-to-NIC pairing); ``nvidia-smi topo -mp`` of the same layout:
  deepseek-ai/DeepEP#397 (verbatim below, only its container-restricted CPU Affinity replaced).
- 8 PCIe GPUs behind two levels of PCIe switches per socket: vllm-project/vllm#11122 (GPU block: rows
  GPU0-GPU5 printed in full there, GPU6-GPU7 by the symmetry of those rows); the dual-port NIC on socket 1's
  own root port: warpem/miss-alignment#106 (NIC0/NIC1 PIX to each other, NODE to that socket's GPUs, SYS to
  the other socket's).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from agent.message import to_dict
from collectors import topology as t
from collectors.formats import pcie_tree as pp
from collectors.formats.pcie_tree import PciNode, Topology
from collectors.nccl import rank_paths as ncclp
from collectors.topology import TopologyCollector, TopologyConfig
from gna_sdk.hostroot import HostRoot
from gna_types.policy import TOPOLOGY_FINDINGS
from sim.host import SimHost
from sim.topology import (
    DGX_GPUS,
    DGX_NVSWITCHES,
    GEN4,
    PCIE_GPUS,
    TopologyBuilder,
    dgx_h100,
    dgx_h100_nvlinks,
    pcie_8gpu,
)
from tests.conftest import AGENT_CMD, Sink, python_env, validate_message
from tests.fake_nvml import NVML_ERROR_NOT_SUPPORTED, FakeGPU, FakeNVML, NVMLError


def _rows(text: str) -> dict[str, dict[str, str]]:
    """A matrix written as nvidia-smi's rows (header line first) -> {row: {column: cell}}."""
    lines = [ln.split() for ln in text.strip().splitlines()]
    header, out = lines[0], {}
    for row in lines[1:]:
        out[row[0]] = dict(zip(header, row[1:1 + len(header)], strict=True))
    return out


# kvcache-ai/Mooncake#2039, `nvidia-smi topo -m` (CPU/NUMA columns dropped)
DGX_TOPO_M = _rows("""
      GPU0 GPU1 GPU2 GPU3 GPU4 GPU5 GPU6 GPU7 NIC0 NIC1 NIC2 NIC3 NIC4 NIC5 NIC6 NIC7 NIC8 NIC9 NIC10 NIC11
GPU0   X   NV18 NV18 NV18 NV18 NV18 NV18 NV18 PIX  PIX  PIX  NODE NODE NODE SYS  SYS  SYS  SYS  SYS   SYS
GPU1  NV18  X   NV18 NV18 NV18 NV18 NV18 NV18 NODE NODE NODE PIX  NODE NODE SYS  SYS  SYS  SYS  SYS   SYS
GPU2  NV18 NV18  X   NV18 NV18 NV18 NV18 NV18 NODE NODE NODE NODE PIX  NODE SYS  SYS  SYS  SYS  SYS   SYS
GPU3  NV18 NV18 NV18  X   NV18 NV18 NV18 NV18 NODE NODE NODE NODE NODE PIX  SYS  SYS  SYS  SYS  SYS   SYS
GPU4  NV18 NV18 NV18 NV18  X   NV18 NV18 NV18 SYS  SYS  SYS  SYS  SYS  SYS  PIX  PIX  PIX  NODE NODE  NODE
GPU5  NV18 NV18 NV18 NV18 NV18  X   NV18 NV18 SYS  SYS  SYS  SYS  SYS  SYS  NODE NODE NODE PIX  NODE  NODE
GPU6  NV18 NV18 NV18 NV18 NV18 NV18  X   NV18 SYS  SYS  SYS  SYS  SYS  SYS  NODE NODE NODE NODE PIX   NODE
GPU7  NV18 NV18 NV18 NV18 NV18 NV18 NV18  X   SYS  SYS  SYS  SYS  SYS  SYS  NODE NODE NODE NODE NODE  PIX
NIC0  PIX  NODE NODE NODE SYS  SYS  SYS  SYS   X   PIX  PIX  NODE NODE NODE SYS  SYS  SYS  SYS  SYS   SYS
NIC1  PIX  NODE NODE NODE SYS  SYS  SYS  SYS  PIX   X   PIX  NODE NODE NODE SYS  SYS  SYS  SYS  SYS   SYS
NIC2  PIX  NODE NODE NODE SYS  SYS  SYS  SYS  PIX  PIX   X   NODE NODE NODE SYS  SYS  SYS  SYS  SYS   SYS
NIC3  NODE PIX  NODE NODE SYS  SYS  SYS  SYS  NODE NODE NODE  X   NODE NODE SYS  SYS  SYS  SYS  SYS   SYS
NIC4  NODE NODE PIX  NODE SYS  SYS  SYS  SYS  NODE NODE NODE NODE  X   NODE SYS  SYS  SYS  SYS  SYS   SYS
NIC5  NODE NODE NODE PIX  SYS  SYS  SYS  SYS  NODE NODE NODE NODE NODE  X   SYS  SYS  SYS  SYS  SYS   SYS
NIC6  SYS  SYS  SYS  SYS  PIX  NODE NODE NODE SYS  SYS  SYS  SYS  SYS  SYS   X   PIX  PIX  NODE NODE  NODE
NIC7  SYS  SYS  SYS  SYS  PIX  NODE NODE NODE SYS  SYS  SYS  SYS  SYS  SYS  PIX   X   PIX  NODE NODE  NODE
NIC8  SYS  SYS  SYS  SYS  PIX  NODE NODE NODE SYS  SYS  SYS  SYS  SYS  SYS  PIX  PIX   X   NODE NODE  NODE
NIC9  SYS  SYS  SYS  SYS  NODE PIX  NODE NODE SYS  SYS  SYS  SYS  SYS  SYS  NODE NODE NODE  X   NODE  NODE
NIC10 SYS  SYS  SYS  SYS  NODE NODE PIX  NODE SYS  SYS  SYS  SYS  SYS  SYS  NODE NODE NODE NODE  X    NODE
NIC11 SYS  SYS  SYS  SYS  NODE NODE NODE PIX  SYS  SYS  SYS  SYS  SYS  SYS  NODE NODE NODE NODE NODE   X
""")

# deepseek-ai/DeepEP#397, `nvidia-smi topo -mp`, verbatim except the CPU Affinity cells: that node ran in a
# container pinned to 0,2,4,6,8,10 / 1,3,5,7,9,11; the simulated sockets have all their CPUs.
DGX_TOPO_MP_TEXT = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tNIC2\tNIC3\tNIC4\tNIC5\tNIC6\tNIC7\tNIC8\tNIC9\tNIC10\tNIC11\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tPIX\tPIX\tPIX\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t0,2,4,6,8,10\t0\t\tN/A\n"
    "GPU1\tNODE\t X \tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tPIX\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t0,2,4,6,8,10\t0\t\tN/A\n"
    "GPU2\tNODE\tNODE\t X \tNODE\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tNODE\tPIX\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t0,2,4,6,8,10\t0\t\tN/A\n"
    "GPU3\tNODE\tNODE\tNODE\t X \tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tNODE\tNODE\tPIX\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t0,2,4,6,8,10\t0\t\tN/A\n"
    "GPU4\tSYS\tSYS\tSYS\tSYS\t X \tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPIX\tPIX\tPIX\tNODE\tNODE\tNODE\t1,3,5,7,9,11\t1\t\tN/A\n"
    "GPU5\tSYS\tSYS\tSYS\tSYS\tNODE\t X \tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tPIX\tNODE\tNODE\t1,3,5,7,9,11\t1\t\tN/A\n"
    "GPU6\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\t X \tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tNODE\tPIX\tNODE\t1,3,5,7,9,11\t1\t\tN/A\n"
    "GPU7\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\t X \tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tNODE\tNODE\tPIX\t1,3,5,7,9,11\t1\t\tN/A\n"
    "NIC0\tPIX\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t X \tPIX\tPIX\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t\t\t\t\n"
    "NIC1\tPIX\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tPIX\t X \tPIX\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t\t\t\t\n"
    "NIC2\tPIX\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tPIX\tPIX\t X \tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t\t\t\t\n"
    "NIC3\tNODE\tPIX\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\t X \tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t\t\t\t\n"
    "NIC4\tNODE\tNODE\tPIX\tNODE\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tNODE\t X \tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t\t\t\t\n"
    "NIC5\tNODE\tNODE\tNODE\tPIX\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tNODE\tNODE\t X \tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t\t\t\t\n"
    "NIC6\tSYS\tSYS\tSYS\tSYS\tPIX\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t X \tPIX\tPIX\tNODE\tNODE\tNODE\t\t\t\t\n"
    "NIC7\tSYS\tSYS\tSYS\tSYS\tPIX\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPIX\t X \tPIX\tNODE\tNODE\tNODE\t\t\t\t\n"
    "NIC8\tSYS\tSYS\tSYS\tSYS\tPIX\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tPIX\tPIX\t X \tNODE\tNODE\tNODE\t\t\t\t\n"
    "NIC9\tSYS\tSYS\tSYS\tSYS\tNODE\tPIX\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\t X \tNODE\tNODE\t\t\t\t\n"
    "NIC10\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tPIX\tNODE\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tNODE\t X \tNODE\t\t\t\t\n"
    "NIC11\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tPIX\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tNODE\tNODE\t X \t\t\t\t\n"
    "\nLegend:\n\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "\nNIC Legend:\n\n"
    "  NIC0: mlx5_0\n  NIC1: mlx5_1\n  NIC2: mlx5_2\n  NIC3: mlx5_3\n  NIC4: mlx5_4\n  NIC5: mlx5_5\n"
    "  NIC6: mlx5_6\n  NIC7: mlx5_7\n  NIC8: mlx5_8\n  NIC9: mlx5_9\n  NIC10: mlx5_10\n  NIC11: mlx5_11\n"
).replace("0,2,4,6,8,10", "0-55,112-167").replace("1,3,5,7,9,11", "56-111,168-223")

# vllm-project/vllm#11122 (GPU block) + warpem/miss-alignment#106 (NIC placement)
PCIE_TOPO_M = _rows("""
      GPU0 GPU1 GPU2 GPU3 GPU4 GPU5 GPU6 GPU7 NIC0 NIC1
GPU0   X   PIX  PXB  PXB  SYS  SYS  SYS  SYS  SYS  SYS
GPU1  PIX   X   PXB  PXB  SYS  SYS  SYS  SYS  SYS  SYS
GPU2  PXB  PXB   X   PIX  SYS  SYS  SYS  SYS  SYS  SYS
GPU3  PXB  PXB  PIX   X   SYS  SYS  SYS  SYS  SYS  SYS
GPU4  SYS  SYS  SYS  SYS   X   PIX  PXB  PXB  NODE NODE
GPU5  SYS  SYS  SYS  SYS  PIX   X   PXB  PXB  NODE NODE
GPU6  SYS  SYS  SYS  SYS  PXB  PXB   X   PIX  NODE NODE
GPU7  SYS  SYS  SYS  SYS  PXB  PXB  PIX   X   NODE NODE
NIC0  SYS  SYS  SYS  SYS  NODE NODE NODE NODE  X   PIX
NIC1  SYS  SYS  SYS  SYS  NODE NODE NODE NODE PIX   X
""")


def _nvml_id(bdf: str) -> str:
    """NVML's spelling of a sysfs bus id: 8-digit domain, upper case."""
    dom, rest = bdf.split(":", 1)
    return f"{int(dom, 16):08x}:{rest}".upper()


@dataclass
class TopoGPU(FakeGPU):
    remotes: list[str] = field(default_factory=list)  # NVML-form remote bus id per link index
    remote_type: int = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
    util: int = 0
    fabric: tuple[int, int] | None = (3, 0)  # (NVML_GPU_FABRIC_STATE_COMPLETED, NVML_SUCCESS)


class _FabricInfo:
    """Stands in for pynvml.c_nvmlGpuFabricInfoV_t: the caller allocates it, NVML fills it."""

    def __init__(self) -> None:
        self.state = -1
        self.status = -1


class TopoNVML(FakeNVML):
    """FakeNVML plus what the topology collector asks: NVLink remotes, utilization, fabric state."""

    NVML_NVLINK_MAX_LINKS = 18
    c_nvmlGpuFabricInfoV_t = _FabricInfo

    def __init__(self, gpus: list[TopoGPU]) -> None:
        super().__init__(list[FakeGPU](gpus))
        self.tgpus = gpus

    def _gpu(self, h: int) -> TopoGPU:
        super()._gpu(h)  # raises GPU_IS_LOST like the real library
        return self.tgpus[h]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return SimpleNamespace(busId=self._gpu(h).remotes[link].encode())  # pynvml gives bytes

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        return self._gpu(h).remote_type

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=self._gpu(h).util, memory=0)

    def nvmlDeviceGetGpuFabricInfoV(self, h: int, info: _FabricInfo) -> int:
        fabric = self._gpu(h).fabric
        if fabric is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info.state, info.status = fabric
        return 0


def dgx_nvml() -> TopoNVML:
    links = dgx_h100_nvlinks()
    return TopoNVML([TopoGPU(_nvml_id(g), remotes=[_nvml_id(r) for r in links[g]]) for g in DGX_GPUS])


def pcie_nvml(bridged: dict[int, int] | None = None, links: int = 4) -> TopoNVML:
    """The PCIe box's GPUs; ``bridged`` pairs GPU i with GPU j through ``links`` direct NVLinks (bridges)."""
    gpus = [TopoGPU(_nvml_id(g), nvlinks=[], remote_type=0, fabric=(0, 0)) for g in PCIE_GPUS]
    for a, b in (bridged or {}).items():
        for x, y in ((a, b), (b, a)):
            gpus[x].nvlinks = [1] * links
            gpus[x].remotes = [_nvml_id(PCIE_GPUS[y])] * links
    return TopoNVML(gpus)


def _emitter(sink: Sink, state_dir: Path | None = None) -> CollectorEmitter:
    return CollectorEmitter("n", "topology", sink, ConditionTracker(None), facts=FactStore(), state_dir=state_dir)


def _collector(host: SimHost, sink: Sink, nvml: Any = None, *, state_dir: Path | None = None,
               clock: Any = None, em: CollectorEmitter | None = None,
               **cfg: Any) -> tuple[TopologyCollector, CollectorEmitter]:
    em = em or _emitter(sink, state_dir)
    if nvml is None:
        cfg.setdefault("nvml", False)  # never this machine's real NVML against a simulated tree
    kw = {"clock": clock} if clock is not None else {}
    return TopologyCollector(TopologyConfig(**cfg), HostRoot(host.root), em, nvml=nvml, **kw), em


async def _run(c: TopologyCollector, em: CollectorEmitter, *, check: bool = False) -> None:
    """One pass as the framework runs it: conditions not re-asserted resolve."""
    em.begin_pass()
    await (c.check() if check else c.collect())
    await em.resolve_unasserted()


def _fired(sink: Sink) -> set[tuple[str, str, str, str]]:
    return {(m.type, m.entity, m.severity, m.reason) for m in sink.messages if m.status == "firing"}


@pytest.fixture
def dgx(tmp_path: Path) -> tuple[SimHost, TopologyBuilder]:
    return dgx_h100(tmp_path / "dgx")


@pytest.fixture
def pcie(tmp_path: Path) -> tuple[SimHost, TopologyBuilder]:
    return pcie_8gpu(tmp_path / "pcie")


# -- the matrices ----------------------------------------------------------------------------------

def test_dgx_h100_matrix_is_what_nvidia_smi_prints(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, _ = dgx
    report, notes = t.topology_report(host.root, nvml=dgx_nvml())
    assert notes == []
    got = {r: {c: v for c, v in row.items() if c != r} for r, row in report["matrix"].items()}
    want = {r: {c: v for c, v in row.items() if v != "X"} for r, row in DGX_TOPO_M.items()}
    assert got == want  # every entry, 20 x 20
    assert all(report["matrix"][r][r] == "X" for r in report["matrix"])
    assert report["devices"]["NIC0"] == {"kind": "nic", "name": "mlx5_0", "bus_id": "0000:18:00.0",
                                         "netdevs": ["ibp24s0"], "numa_node": 0, "cpu_affinity": "0-55,112-167"}
    assert report["nvswitches"] == list(DGX_NVSWITCHES) and report["nvlink_source"] == "nvml"
    assert report["skipped"] == [] and report["unparsable"] == []


def test_dgx_h100_pcie_only_text_is_nvidia_smi_topo_mp_verbatim(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, _ = dgx
    report, _ = t.topology_report(host.root, nvml=dgx_nvml(), pcie_only=True)
    assert t.render_text(report).rstrip("\n") == DGX_TOPO_MP_TEXT.rstrip("\n")


def test_pcie_box_matrix_is_what_nvidia_smi_prints(pcie: tuple[SimHost, TopologyBuilder]) -> None:
    host, _ = pcie
    report, _ = t.topology_report(host.root, use_nvml=False)
    got = {r: {c: v for c, v in row.items() if c != r} for r, row in report["matrix"].items()}
    assert got == {r: {c: v for c, v in row.items() if v != "X"} for r, row in PCIE_TOPO_M.items()}
    text = t.render_text(report)
    assert text.splitlines()[1] == "GPU0\t X \tPIX\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t0-47,96-143\t0\t\tN/A"
    assert "  NV#  = Connection traversing a bonded set of # NVLinks\n" in text  # topo -m keeps it, -mp drops it
    assert text.endswith("\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n\n")


def test_numa_unknown_gives_sys_and_na_like_nvidia_smi(tmp_path: Path) -> None:
    # vllm#11122 printed NUMA Affinity N/A (numa_node -1), CPU Affinity all CPUs, and still SYS across sockets
    host = SimHost.gpu_node(tmp_path / "h", gpus=0)
    b = TopologyBuilder(host)
    for i, dom in enumerate(("0000:17", "0000:97")):
        hb = b.host_bridge(dom, numa=-1, cpulist="0-95")
        b.gpu(b.bridge(hb, f"{dom}:01.0"), f"{dom[:5]}{int(dom[5:], 16) + 1:02x}:00.0", i)
    report, _ = t.topology_report(host.root, use_nvml=False)
    assert report["matrix"]["GPU0"]["GPU1"] == "SYS"
    line = t.render_text(report).splitlines()[1]
    assert line == "GPU0\t X \tSYS\t0-95\tN/A\t\tN/A"
    assert "NIC Legend" not in t.render_text(report)


def test_api_nearest_nics_and_nic_distance(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, _ = dgx
    topo = pp.read_topology(HostRoot(host.root))
    assert pp.nearest_nics(topo, "GPU0") == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert pp.nearest_nics(topo, "00000000:43:00.0") == ["mlx5_3"]  # NVML's spelling of GPU1
    assert [pp.nearest_nics(topo, g) for g in DGX_GPUS[5:]] == [["mlx5_9"], ["mlx5_10"], ["mlx5_11"]]
    assert pp.nic_distance(topo, "GPU0", "mlx5_0") == "PIX"
    assert pp.nic_distance(topo, "GPU0", "ibp24s0") == "PIX"  # by interface name
    assert pp.nic_distance(topo, "GPU1", "mlx5_0") == "NODE"
    assert pp.nic_distance(topo, "GPU7", "NIC0") == "SYS"
    with pytest.raises(KeyError):
        pp.nic_distance(topo, "GPU8", "mlx5_0")
    with pytest.raises(KeyError):
        pp.nic_distance(topo, "GPU0", "mlx5_99")


def test_nccl_path_differs_from_nvidia_smi_where_nccl_differs(dgx: tuple[SimHost, TopologyBuilder],
                                                               tmp_path: Path) -> None:
    host, _ = dgx
    topo = pp.read_topology(HostRoot(host.root))
    assert ncclp.nccl_path(topo, "GPU0", "mlx5_0") == "PIX"
    # NCCL >= 2.6 hangs all host bridges of a NUMA node off one CPU node: nvidia-smi's NODE is NCCL's PHB
    assert (pp.pcie_distance(topo, DGX_GPUS[0], topo.resolve("mlx5_3")), ncclp.nccl_path(topo, "GPU0", "mlx5_3")) == \
           ("NODE", "PHB")
    assert ncclp.nccl_path(topo, "GPU0", "mlx5_6") == "SYS"
    # a Broadcom Gen4 two-level switch (topo.cc getBcmGen: 0x1000 c010 1000 a0xx): nvidia-smi counts two
    # bridges (PXB), NCCL flattens the chip into one switch (PIX)
    h2 = SimHost.gpu_node(tmp_path / "bcm", gpus=0)
    b = TopologyBuilder(h2)
    rp = b.bridge(b.host_bridge("0000:05", numa=0, cpulist="0-7"), "0000:05:01.0")
    top = b.function(rp, "0000:06:00.0", vendor="0x1000", device="0xc010", klass="0x060400",
                     subsystem=("0x1000", "0xa064"))
    d0 = b.bridge(top, "0000:07:00.0", vendor="0x1000", device="0xc010")
    d1 = b.bridge(top, "0000:07:01.0", vendor="0x1000", device="0xc010")
    sub = b.function(d0, "0000:08:00.0", vendor="0x1000", device="0xc010", klass="0x060400",
                     subsystem=("0x1000", "0xa064"))
    b.gpu(b.bridge(sub, "0000:09:00.0", vendor="0x1000", device="0xc010"), "0000:0a:00.0", 0)
    b.nic(d1, "0000:0b:00.0", "mlx5_0", "ibp11s0")
    topo2 = pp.read_topology(HostRoot(h2.root))
    assert (pp.pcie_distance(topo2, "0000:0a:00.0", "0000:0b:00.0"), ncclp.nccl_path(topo2, "GPU0", "mlx5_0")) == \
           ("PXB", "PIX")


# -- gpu-node-agent topo --------------------------------------------------------------------------------

@pytest.fixture
def plugin_site(tmp_path: Path) -> Path:
    """The collector's entry point as an installed distribution would declare it (pyproject registers it
    for the real install); the command must find it there, not import collectors itself."""
    site = tmp_path / "site"
    dist = site / "gna_topology_ep-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gna-topology-ep\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[gpu_node_agent.collectors]\ntopology = collectors.topology:TopologyCollector\n")
    return site


def _topo_cli(site: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENT_CMD, "topo", *args], capture_output=True, text=True, timeout=60,
                          env=python_env(site))


def test_cli_text_and_json(dgx: tuple[SimHost, TopologyBuilder], plugin_site: Path) -> None:
    host, _ = dgx
    r = _topo_cli(plugin_site, "--host-root", str(host.root), "--no-nvml", "--pcie-only")
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == DGX_TOPO_MP_TEXT.rstrip("\n")
    r = _topo_cli(plugin_site, "--host-root", str(host.root), "--no-nvml", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # without NVML the GPU pairs are their PCIe distances (the -mp block), NIC entries as in topo -m
    lines = [ln.split("\t") for ln in DGX_TOPO_MP_TEXT.split("\n\nLegend")[0].splitlines()]
    names = lines[0][1:21]
    mp = {row[0]: {c: v.strip() for c, v in zip(names, row[1:21], strict=True)} for row in lines[1:]}
    nic_names = {k: d["name"] for k, d in doc["devices"].items() if d["kind"] == "nic"}
    assert {row: {c: v for c, v in cells.items() if not c.startswith("mlx5_")} for row, cells in doc["matrix"].items()
            if not row.startswith("mlx5_")} == mp
    for nic, name in nic_names.items():  # each NIC also under its RDMA device name, row and column
        assert doc["matrix"][name] == doc["matrix"][nic]
        assert all(doc["matrix"][g][name] == doc["matrix"][g][nic] for g in mp)
    assert doc["matrix"]["GPU0"]["NIC0"] == "PIX" and doc["matrix"]["GPU0"]["mlx5_0"] == "PIX"
    assert doc["matrix"]["GPU0"]["GPU1"] == "NODE"
    assert doc["devices"]["GPU0"]["bus_id"] == "0000:1b:00.0"
    assert doc["devices"]["GPU0"]["nearest_nics"] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert doc["nvlink_source"] == "not used (--no-nvml)"
    assert "NVLink not read (--no-nvml)" in r.stderr


# SimHost.gpu_node(gpus=8, hcas=8, storage_nic=True), the demo's node: an HGX H100 baseboard in a 2-socket
# server, each GPU behind its own PCIe switch with its ConnectX-7 (mlx5_<i>), GPU0-3 on socket 0, GPU4-7 on
# socket 1, the storage NIC (mlx5_8) on socket 0's own root port. NVLink left out: PCIe distances only.
SIM_NODE_TOPO_MP = _rows("""
      GPU0 GPU1 GPU2 GPU3 GPU4 GPU5 GPU6 GPU7 NIC0 NIC1 NIC2 NIC3 NIC4 NIC5 NIC6 NIC7 NIC8
GPU0   X   NODE NODE NODE SYS  SYS  SYS  SYS  PIX  NODE NODE NODE SYS  SYS  SYS  SYS  NODE
GPU1  NODE  X   NODE NODE SYS  SYS  SYS  SYS  NODE PIX  NODE NODE SYS  SYS  SYS  SYS  NODE
GPU2  NODE NODE  X   NODE SYS  SYS  SYS  SYS  NODE NODE PIX  NODE SYS  SYS  SYS  SYS  NODE
GPU3  NODE NODE NODE  X   SYS  SYS  SYS  SYS  NODE NODE NODE PIX  SYS  SYS  SYS  SYS  NODE
GPU4  SYS  SYS  SYS  SYS   X   NODE NODE NODE SYS  SYS  SYS  SYS  PIX  NODE NODE NODE SYS
GPU5  SYS  SYS  SYS  SYS  NODE  X   NODE NODE SYS  SYS  SYS  SYS  NODE PIX  NODE NODE SYS
GPU6  SYS  SYS  SYS  SYS  NODE NODE  X   NODE SYS  SYS  SYS  SYS  NODE NODE PIX  NODE SYS
GPU7  SYS  SYS  SYS  SYS  NODE NODE NODE  X   SYS  SYS  SYS  SYS  NODE NODE NODE PIX  SYS
NIC0  PIX  NODE NODE NODE SYS  SYS  SYS  SYS   X   NODE NODE NODE SYS  SYS  SYS  SYS  NODE
NIC1  NODE PIX  NODE NODE SYS  SYS  SYS  SYS  NODE  X   NODE NODE SYS  SYS  SYS  SYS  NODE
NIC2  NODE NODE PIX  NODE SYS  SYS  SYS  SYS  NODE NODE  X   NODE SYS  SYS  SYS  SYS  NODE
NIC3  NODE NODE NODE PIX  SYS  SYS  SYS  SYS  NODE NODE NODE  X   SYS  SYS  SYS  SYS  NODE
NIC4  SYS  SYS  SYS  SYS  PIX  NODE NODE NODE SYS  SYS  SYS  SYS   X   NODE NODE NODE SYS
NIC5  SYS  SYS  SYS  SYS  NODE PIX  NODE NODE SYS  SYS  SYS  SYS  NODE  X   NODE NODE SYS
NIC6  SYS  SYS  SYS  SYS  NODE NODE PIX  NODE SYS  SYS  SYS  SYS  NODE NODE  X   NODE SYS
NIC7  SYS  SYS  SYS  SYS  NODE NODE NODE PIX  SYS  SYS  SYS  SYS  NODE NODE NODE  X   SYS
NIC8  NODE NODE NODE NODE SYS  SYS  SYS  SYS  NODE NODE NODE NODE SYS  SYS  SYS  SYS   X
""")


def _text_matrix(text: str) -> dict[str, dict[str, str]]:
    """The matrix block of render_text's output (tab-separated, CPU/NUMA columns dropped)."""
    lines = [ln.split("\t") for ln in text.split("\n\n")[0].splitlines()]
    names = [c for c in lines[0][1:] if c.startswith(("GPU", "NIC")) and " " not in c]
    return {row[0]: {c: v.strip() for c, v in zip(names, row[1:1 + len(names)], strict=True)} for row in lines[1:]}


def test_cli_on_the_simulated_gpu_node(tmp_path: Path, plugin_site: Path) -> None:
    """`gpu-node-agent topo` on a fresh SimHost.gpu_node root (what `make demo` / `demo --keep` leave): every
    GPU PIX to its own NIC, NODE within a socket, SYS across, the NIC columns and legend, nothing refused,
    and NVLink said to be unknown without NVML rather than left to read as SYS."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=8, hcas=8, storage_nic=True)
    r = _topo_cli(plugin_site, "--host-root", str(host.root), "--no-nvml")
    assert r.returncode == 0, r.stderr
    assert "refused" not in r.stderr and "unreadable" not in r.stderr, r.stderr
    assert _text_matrix(r.stdout) == SIM_NODE_TOPO_MP
    header = r.stdout.splitlines()[0].split("\t")
    assert header[1:18] == [f"GPU{i}" for i in range(8)] + [f"NIC{j}" for j in range(9)]
    assert r.stdout.splitlines()[1].endswith("\t0-55,112-167\t0\t\tN/A")
    assert r.stdout.splitlines()[5].endswith("\t56-111,168-223\t1\t\tN/A")
    assert r.stdout.endswith("\nNIC Legend:\n\n" + "".join(f"  NIC{j}: mlx5_{j}\n" for j in range(9)) + "\n")
    assert "\nNVLink: unknown without NVML (not used (--no-nvml)). GPU-to-GPU cells show the PCIe path only" \
           in r.stdout.split("\nLegend:")[0]
    r = _topo_cli(plugin_site, "--host-root", str(host.root), "--no-nvml", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["skipped"] == [] and doc["unparsable"] == []
    assert doc["nvlink_known"] is False and doc["nvlink_source"] == "not used (--no-nvml)"
    assert {r: {c: v for c, v in cells.items() if not c.startswith("mlx5_")}
            for r, cells in doc["matrix"].items() if not r.startswith("mlx5_")} == SIM_NODE_TOPO_MP
    assert doc["matrix"]["GPU3"]["mlx5_3"] == "PIX" and doc["matrix"]["mlx5_7"]["GPU0"] == "SYS"
    assert doc["devices"]["NIC0"] == {"kind": "nic", "name": "mlx5_0", "bus_id": "0000:17:00.0",
                                      "netdevs": ["ibp23s0"], "numa_node": 0, "cpu_affinity": "0-55,112-167"}
    assert doc["devices"]["NIC8"]["netdevs"] == ["enp13s0np0"]
    assert [doc["devices"][f"GPU{i}"]["bus_id"] for i in range(8)] == [
        f"0000:{b}:00.0" for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]
    assert [doc["devices"][f"GPU{i}"]["nearest_nics"] for i in range(8)] == [[f"mlx5_{i}"] for i in range(8)]
    assert doc["devices"]["GPU4"]["nccl_path_to_nearest"] == "PIX" and doc["devices"]["GPU4"]["numa_node"] == 1


def test_simulated_gpu_node_variants_and_the_hgx_nvswitches(tmp_path: Path) -> None:
    """Fewer NICs than GPUs, more NICs than GPUs (the extras behind the GPU switches in turn), and hgx_node's
    NVSwitches in the tree: all read without a refusal; with NVML the GPU pairs are NV18 and the note goes."""
    few = SimHost.gpu_node(tmp_path / "few", gpus=8, hcas=2)
    report, notes = t.topology_report(few.root, use_nvml=False)
    assert report["skipped"] == [] and not any("refused" in n for n in notes)
    assert [report["matrix"]["GPU0"][f"NIC{j}"] for j in range(2)] == ["PIX", "NODE"]
    assert report["matrix"]["GPU4"]["NIC0"] == "SYS"
    many = SimHost.gpu_node(tmp_path / "many", gpus=8, hcas=12)
    topo = pp.read_topology(HostRoot(many.root))
    assert topo.skipped == [] and topo.bad_values == [] and len(topo.nics) == 12
    assert pp.nearest_nics(topo, "GPU0") == ["mlx5_0", "mlx5_8"] and pp.nearest_nics(topo, "GPU4") == ["mlx5_4"]
    assert pp.nic_distance(topo, "mlx5_0", "mlx5_8") == "PIX"
    hgx = SimHost.hgx_node(tmp_path / "hgx")
    nvswitches = [f"0000:{b}:00.0" for b in ("05", "06", "07", "08")]
    nvml = TopoNVML([TopoGPU(_nvml_id(g), remotes=[_nvml_id(sw) for sw, n in zip(nvswitches, (4, 4, 5, 5),
                                                                                   strict=True) for _ in range(n)])
                     for g in pp.read_topology(HostRoot(hgx.root)).gpus])
    report, notes = t.topology_report(hgx.root, nvml=nvml)
    assert notes == [] and report["skipped"] == [] and report["nvswitches"] == nvswitches
    assert report["nvlink_known"] is True
    assert {report["matrix"][f"GPU{a}"][f"GPU{b}"] for a in range(8) for b in range(8) if a != b} == {"NV18"}
    nics = [f"NIC{j}" for j in range(9)]
    assert [report["matrix"]["GPU5"][n] for n in nics] == [SIM_NODE_TOPO_MP["GPU5"][n] for n in nics]
    assert "NVLink: unknown" not in t.render_text(report)
    # the healthy HGX node stays healthy on its real tree: its job's channels use GPU0's own NIC
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(hgx.root), "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    assert [(c["type"], c["reason"]) for c in json.loads(r.stdout)["conditions"]] == [], r.stderr


def test_cli_exit_codes(tmp_path: Path, plugin_site: Path, monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    r = _topo_cli(plugin_site, "--host-root", str(tmp_path / "nope"))
    assert r.returncode == 66 and "does not exist" in r.stderr
    r = _topo_cli(plugin_site, "--host-root", str(tmp_path), "--format", "yaml")
    assert r.returncode == 64
    from agent import cli, topo_cmd

    monkeypatch.setattr(topo_cmd, "entry_points", lambda **kw: [])  # a node without the plugin installed
    assert cli.main(["topo", "--host-root", str(tmp_path)]) == 69
    assert "not installed" in capsys.readouterr().err


# -- hostile sysfs ----------------------------------------------------------------------------------------

def test_hostile_links_are_refused_and_counted(dgx: tuple[SimHost, TopologyBuilder], tmp_path: Path) -> None:
    host, _ = dgx
    bus = host.p("/sys/bus/pci/devices")
    (bus / "0000:f0:00.0").symlink_to("0000:f0:00.0")  # a loop onto itself
    (bus / "0000:f1:00.0").symlink_to("0000:f2:00.0")  # a two-step loop
    (bus / "0000:f2:00.0").symlink_to("0000:f1:00.0")
    outside = tmp_path / "elsewhere" / "sys" / "devices" / "pci0000:f3" / "0000:f3:00.0"
    outside.mkdir(parents=True)
    (outside / "vendor").write_text("0x10de\n")
    (outside / "class").write_text("0x030200\n")
    (bus / "0000:f3:00.0").symlink_to(outside)  # absolute, out of the host root
    (bus / "0000:f4:00.0").symlink_to("../../../../../elsewhere/sys/devices/pci0000:f3/0000:f3:00.0")  # relative, out
    (bus / "0000:f5:00.0").symlink_to("../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/"
                                      "0000:1b:00.0")  # names another device (GPU0)
    (bus / "0000:f6:00.0").symlink_to("nowhere")  # dangling
    (bus / "junk-entry").mkdir()
    plat = host.p("/sys/devices/platform/soc/0000:f7:00.0")
    plat.mkdir(parents=True)
    (bus / "0000:f7:00.0").symlink_to(os.path.relpath(plat, bus))  # no PCI host bridge above it
    ib = host.p("/sys/class/infiniband")
    (ib / "mlx5_99").mkdir()
    (ib / "mlx5_99" / "device").symlink_to(outside)
    topo = pp.read_topology(HostRoot(host.root))
    reasons = {s.entry.rsplit("/", 1)[-1]: s.reason for s in topo.skipped}
    assert reasons["0000:f0:00.0"].startswith("unresolvable") and reasons["0000:f1:00.0"].startswith("unresolvable")
    assert "outside the host root" in reasons["0000:f3:00.0"] and "outside the host root" in reasons["0000:f4:00.0"]
    assert "another device" in reasons["0000:f5:00.0"] and reasons["0000:f6:00.0"].startswith("unresolvable")
    assert reasons["junk-entry"] == "not a PCI bus id" and "host bridge" in reasons["0000:f7:00.0"]
    assert "outside the host root" in reasons["mlx5_99"]
    assert len(topo.gpus) == 8 and "0000:f3:00.0" not in topo.nodes  # nothing from outside was read
    assert [n.name for n in topo.nics] == [f"mlx5_{i}" for i in range(12)]


def test_garbage_and_missing_attribute_files(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, b = dgx
    gpu0, gpu1 = b.functions[DGX_GPUS[0]].real, b.functions[DGX_GPUS[1]].real
    host.write(f"{gpu0}/numa_node", "banana\n")
    host.write(f"{gpu0}/current_link_width", "999\n")
    host.write(f"{gpu0}/max_link_speed", "fast\n")
    host.p(f"{gpu0}/local_cpulist").write_bytes(b"\x00\xff\xfe garbage \x80")
    host.p(f"{gpu1}/class").unlink()  # no class: not recognised as a GPU
    host.p(f"{b.functions[DGX_GPUS[2]].real}/current_link_width").unlink()
    host.p(f"{b.functions[DGX_GPUS[3]].real}/vendor").write_bytes(b"0x" + b"f" * 100_000)  # huge
    topo = pp.read_topology(HostRoot(host.root))
    bad = {s.entry for s in topo.bad_values}
    assert {f"{DGX_GPUS[0]}/numa_node", f"{DGX_GPUS[0]}/current_link_width", f"{DGX_GPUS[0]}/max_link_speed",
            f"{DGX_GPUS[0]}/local_cpulist", f"{DGX_GPUS[3]}/vendor"} <= bad
    n0 = topo.nodes[DGX_GPUS[0]]
    assert (n0.numa_node, n0.cur_width, n0.max_speed, n0.cpus) == (None, None, None, None)
    assert DGX_GPUS[1] not in topo.gpus and DGX_GPUS[3] not in topo.gpus and len(topo.gpus) == 6
    assert topo.nodes[DGX_GPUS[2]].cur_width is None


def test_attribute_fifo_symlink_and_size_never_block_or_leak(tmp_path: Path) -> None:
    d = tmp_path / "dev"
    d.mkdir()
    os.mkfifo(d / "vendor")  # opening a FIFO for reading blocks without O_NONBLOCK
    (tmp_path / "secret").write_text("0x10de\n")
    (d / "class").symlink_to(tmp_path / "secret")
    (d / "device").write_text("0x" + "1" * 10_000)
    done: list[Any] = []
    th = threading.Thread(target=lambda: done.extend(pp.read_attr(str(d), n) for n in ("vendor", "class", "device")))
    th.start()
    th.join(5)
    assert not th.is_alive(), "reading a FIFO attribute blocked"
    assert done[:2] == [None, None]
    assert len(done[2]) == pp.ATTR_LIMIT + 1  # bounded: the parser then refuses it as too long
    assert pp.parse_hex(done[2], 16) is None


def test_entry_limits_and_duplicates(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, _ = dgx
    topo = pp.read_topology(HostRoot(host.root), max_devices=10)
    assert any("more than 10 entries" in s.reason for s in topo.skipped) and len(topo.nodes) < 60
    # the same bus id in two places of the tree is refused, not merged
    other = host.p("/sys/devices/pci0000:e0/0000:e0:01.0/0000:1b:00.0")
    other.mkdir(parents=True)
    (host.p("/sys/class/net") / "evil0").mkdir()
    (host.p("/sys/class/net") / "evil0" / "device").symlink_to(other)
    topo = pp.read_topology(HostRoot(host.root))
    assert any(s.entry == "/sys/class/net/evil0" and "two places" in s.reason for s in topo.skipped)
    assert topo.nodes[DGX_GPUS[0]].host_bridge == "pci0000:15"


def test_missing_pci_bus_and_empty_root(tmp_path: Path) -> None:
    report, notes = t.topology_report(tmp_path, use_nvml=False)
    assert report["matrix"] == {} and any("missing" in n for n in notes)
    assert t.render_text(report).startswith("\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n\nLegend:")


# -- findings ---------------------------------------------------------------------------------------------

async def test_healthy_trees_raise_nothing(dgx: tuple[SimHost, TopologyBuilder],
                                           pcie: tuple[SimHost, TopologyBuilder], tmp_path: Path) -> None:
    for host, nvml in ((dgx[0], dgx_nvml()), (pcie[0], pcie_nvml()), (dgx[0], None), (pcie[0], None)):
        sink = Sink()
        c, em = _collector(host, sink, nvml)
        await _run(c, em, check=True)
        await _run(c, em)
        assert sink.messages == [], [m.message for m in sink.messages]
        assert not em.skipped
    # the existing simulated nodes other tests check stay quiet too (no topology, no processes in view)
    for host in (SimHost.gpu_node(tmp_path / "plain", gpus=8), SimHost.hgx_node(tmp_path / "hgx")):
        sink = Sink()
        c, em = _collector(host, sink)
        await _run(c, em, check=True)
        assert sink.messages == []


async def test_link_width_fires_always_speed_only_under_load(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, b = dgx
    b.set_link(DGX_GPUS[2], width=8)
    b.set_link(DGX_GPUS[5], speed="2.5 GT/s PCIe")  # idle power saving: normal while idle
    sink = Sink()
    c, em = _collector(host, sink)  # no NVML: width is still checked, speed is not
    await _run(c, em)
    assert _fired(sink) == {("PCIeLinkDegraded", f"gpu:{DGX_GPUS[2]}", "warning", "WidthBelowMax")}
    assert "NVML" in em.blind
    nvml = dgx_nvml()
    c, em = _collector(host, sink, nvml, em=em)
    await _run(c, em)
    assert len(sink.messages) == 1, "the same finding again is no new message"
    nvml.tgpus[5].util = 97
    await _run(c, em)
    assert _fired(sink) == {("PCIeLinkDegraded", f"gpu:{DGX_GPUS[2]}", "warning", "WidthBelowMax"),
                            ("PCIeLinkDegraded", f"gpu:{DGX_GPUS[5]}", "warning", "SpeedBelowMaxUnderLoad")}
    msg = next(m for m in sink.messages if m.reason == "SpeedBelowMaxUnderLoad")
    assert msg.details["current_speed_gts"] == 2.5 and msg.details["expected_speed_gts"] == 32.0
    for m in sink.messages:
        validate_message(to_dict(m))
    b.set_link(DGX_GPUS[2], width=16)
    nvml.tgpus[5].util = 0
    await _run(c, em)
    assert {(m.entity, m.status) for m in sink.messages[-2:]} == {(f"gpu:{DGX_GPUS[2]}", "resolved"),
                                                                  (f"gpu:{DGX_GPUS[5]}", "resolved")}


async def test_expected_link_is_the_lesser_of_both_ends(tmp_path: Path) -> None:
    # a Gen5 GPU in a Gen4 slot trains at 16 GT/s and is healthy (NCCL's xml.cc takes the same minimum)
    host = SimHost.gpu_node(tmp_path / "h", gpus=0)
    b = TopologyBuilder(host)
    rp = b.bridge(b.host_bridge("0000:17", numa=0, cpulist="0-7"), "0000:17:01.0", speed=GEN4, width=8)
    b.gpu(rp, "0000:18:00.0", 0)
    b.set_link("0000:18:00.0", speed=GEN4, width=8)
    nvml = TopoNVML([TopoGPU(_nvml_id("0000:18:00.0"), nvlinks=[], util=100, fabric=None)])
    sink = Sink()
    c, em = _collector(host, sink, nvml)
    await _run(c, em)
    assert sink.messages == []
    assert t.expected_link(pp.read_topology(HostRoot(host.root)), "0000:18:00.0") == (16.0, 8)


async def test_nvlink_degraded_on_nvswitch_names_only_the_gpu(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, _ = dgx
    nvml = dgx_nvml()
    nvml.tgpus[3].nvlinks[16:] = [0, 0]
    sink = Sink()
    c, em = _collector(host, sink, nvml)
    await _run(c, em)
    assert _fired(sink) == {("NVLinkDegraded", f"gpu:{DGX_GPUS[3]}", "warning", "FewerNVLinksThanExpected")}
    (msg,) = sink.messages
    assert em.facts.get("topology.gpus")[DGX_GPUS[3]] == {"index": 3, "numa_node": 0, "nearest_nics": ["mlx5_5"],
                                                          "nic_distance": "PIX"}
    assert msg.details["links_up"] == 16 and msg.details["expected"] == 18 and msg.details["pairs"]["GPU0"] == "NV16"
    report, _ = t.topology_report(host.root, nvml=nvml)
    assert report["matrix"]["GPU3"]["GPU0"] == report["matrix"]["GPU0"]["GPU3"] == "NV16"
    assert report["matrix"]["GPU0"]["GPU1"] == "NV18"
    nvml.tgpus[3].nvlinks = []  # every link gone (NVML: not supported)
    await _run(c, em)
    assert ("NVLinkDegraded", f"gpu:{DGX_GPUS[3]}", "critical", "NoNVLinkLeft") in _fired(sink)
    report, _ = t.topology_report(host.root, nvml=nvml)
    assert report["matrix"]["GPU3"]["GPU0"] == "NODE"  # no NVLink left: the PCIe distance
    # every GPU with one link down: NVML still knows 18 links per GPU, so 18 is expected
    nvml = dgx_nvml()
    for g in nvml.tgpus:
        g.nvlinks[17] = 0
    sink = Sink()
    c, em = _collector(host, sink, nvml)
    await _run(c, em)
    assert len(_fired(sink)) == 8
    # links NVML does not even list (a driver that reports 17) are only caught with the count configured
    for g in nvml.tgpus:
        g.nvlinks, g.remotes = g.nvlinks[:17], g.remotes[:17]
    sink = Sink()
    c, em = _collector(host, sink, nvml)
    await _run(c, em)
    assert sink.messages == []
    c, em = _collector(host, sink, nvml, expected_nvlinks_per_pair=18)
    await _run(c, em)
    assert len(_fired(sink)) == 8


async def test_nvlink_degraded_on_bridged_pcie_pairs(pcie: tuple[SimHost, TopologyBuilder],
                                                     tmp_path: Path) -> None:
    host, _ = pcie
    nvml = pcie_nvml({0: 1, 2: 3})
    report, _ = t.topology_report(host.root, nvml=nvml)
    assert report["matrix"]["GPU0"]["GPU1"] == "NV4" and report["matrix"]["GPU0"]["GPU2"] == "PXB"
    sink = Sink()
    state = tmp_path / "state"
    state.mkdir()
    host.set_boot("00000000-0000-4000-8000-00000000b001")
    c, em = _collector(host, sink, nvml, state_dir=state)
    await _run(c, em)
    assert sink.messages == []
    nvml.tgpus[2].nvlinks[2:] = [0, 0]
    nvml.tgpus[3].nvlinks[1] = 0
    # a restarted agent still expects NV4: the best count since boot persists
    c, em = _collector(host, sink, nvml, state_dir=state)
    await _run(c, em)
    pair = f"nvlink:{PCIE_GPUS[2]}-{PCIE_GPUS[3]}"
    assert _fired(sink) == {("NVLinkDegraded", pair, "warning", "FewerNVLinksThanExpected")}
    assert sink.messages[0].details["now"] == 2 and sink.messages[0].details["expected"] == 4
    host.set_boot("00000000-0000-4000-8000-00000000b002")  # a new boot forgets what was seen
    sink = Sink()
    c, em = _collector(host, sink, nvml, state_dir=state)
    await _run(c, em)
    assert sink.messages == []


async def test_fabric_manager_down_waits_for_grace_then_fires(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, b = dgx
    b.stop_fabric_manager()
    now = [1000.0]
    sink = Sink()
    c, em = _collector(host, sink, dgx_nvml(), clock=lambda: now[0], fabric_grace=300.0)
    await _run(c, em)
    assert sink.messages == [], "Fabric Manager may still be starting after boot"
    now[0] += 301
    await _run(c, em)
    assert _fired(sink) == {("FabricManagerNotRunning", "service:nvidia-fabricmanager", "warning",
                             "FabricRegistered")}
    b.start_fabric_manager()
    await _run(c, em)
    assert sink.messages[-1].status == "resolved"
    b.stop_fabric_manager()
    await _run(c, em)
    assert sink.messages[-1].status == "resolved", "a new absence waits its grace again"


async def test_fabric_not_registered_is_critical_and_cordons(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, b = dgx
    b.stop_fabric_manager()
    nvml = dgx_nvml()
    for g in nvml.tgpus:
        g.fabric = (2, 0)  # NVML_GPU_FABRIC_STATE_IN_PROGRESS
    sink = Sink()
    c, em = _collector(host, sink, nvml)
    await _run(c, em, check=True)  # `check` (a prolog) does not wait
    fired = _fired(sink)
    assert ("FabricManagerNotRunning", "service:nvidia-fabricmanager", "critical", "GPUsNotRegistered") in fired
    assert {(ty, e) for ty, e, sev, why in fired if ty == "GPUFabricNotReady"} == {
        ("GPUFabricNotReady", f"gpu:{g}") for g in DGX_GPUS}
    assert all(m.suggested_action == "cordon" for m in sink.messages)
    for m in sink.messages:
        validate_message(to_dict(m))


async def test_fabric_completed_with_error_fires_at_once(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, _ = dgx
    nvml = dgx_nvml()
    nvml.tgpus[6].fabric = (3, 999)  # COMPLETED, but with an NVML error status
    sink = Sink()
    c, em = _collector(host, sink, nvml, fabric_grace=3600.0)
    await _run(c, em)
    assert _fired(sink) == {("GPUFabricNotReady", f"gpu:{DGX_GPUS[6]}", "critical", "CompletedWithError")}


async def test_fabric_manager_without_nvml_and_without_process_view(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, b = dgx
    b.stop_fabric_manager()
    sink = Sink()
    c, em = _collector(host, sink)  # NVSwitches on the PCI bus, NVML unavailable
    await _run(c, em, check=True)
    assert _fired(sink) == {("FabricManagerNotRunning", "service:nvidia-fabricmanager", "critical", "NoProcess")}
    assert sink.messages[0].suggested_action == "fix_config"
    for pid in os.listdir(host.p("/proc")):
        if pid.isdigit():
            for f in host.p(f"/proc/{pid}").iterdir():
                f.unlink()
    sink = Sink()
    c, em = _collector(host, sink)
    await _run(c, em, check=True)
    assert sink.messages == [] and "/proc/*/comm" in em.blind  # cannot see processes: says so, claims nothing


async def test_nvswitch_known_only_from_nvml(pcie: tuple[SimHost, TopologyBuilder]) -> None:
    # HGX B200's NVSwitches are no PCIe devices of the host (Fabric Manager guide): NVML's remote type says it
    host, _ = pcie
    nvml = TopoNVML([TopoGPU(_nvml_id(g), remotes=[_nvml_id("0000:ff:00.0")] * 18) for g in PCIE_GPUS])
    sink = Sink()
    c, em = _collector(host, sink, nvml)
    await _run(c, em, check=True)
    assert _fired(sink) == {("FabricManagerNotRunning", "service:nvidia-fabricmanager", "warning",
                             "FabricRegistered")}
    report, _ = t.topology_report(host.root, nvml=nvml)
    assert report["matrix"]["GPU0"]["GPU7"] == "NV18"


async def test_hostile_tree_is_counted_not_fatal(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, b = dgx
    (host.p("/sys/bus/pci/devices") / "0000:f0:00.0").symlink_to("0000:f0:00.0")
    host.write(f"{b.functions[DGX_GPUS[0]].real}/numa_node", "\x00\x01\x02\n")
    sink = Sink()
    c, em = _collector(host, sink)
    await _run(c, em)
    assert sink.messages == []
    assert em.skipped["/sys (topology)"][0] == 1 and em.skipped["/sys/devices attributes"][0] == 1


async def test_lost_gpu_and_nvml_errors_do_not_break_the_pass(dgx: tuple[SimHost, TopologyBuilder]) -> None:
    host, _ = dgx
    nvml = dgx_nvml()
    nvml.tgpus[1].lost = True

    def broken(h: int) -> Any:
        raise NVMLError(999)  # NVML_ERROR_UNKNOWN

    nvml.nvmlDeviceGetUtilizationRates = broken  # type: ignore[method-assign]
    sink = Sink()
    c, em = _collector(host, sink, nvml)
    await _run(c, em)
    assert sink.messages == []  # GPU1's links are not known: no claim about it
    assert any(k.startswith("NVML nvmlDeviceGetUtilizationRates") for k in em.blind)


def test_read_nvlinks_from_pynvml_shapes(pcie: tuple[SimHost, TopologyBuilder]) -> None:
    nvml = dgx_nvml()
    nvml.tgpus[0].nvlinks[5] = 0
    view = t.read_nvlinks(nvml, {DGX_GPUS[0]: 0, DGX_GPUS[1]: 1})
    assert view.link_total == {DGX_GPUS[0]: 18, DGX_GPUS[1]: 18}
    assert len(view.nvlinks[DGX_GPUS[0]]) == 17 and set(view.nvlinks[DGX_GPUS[1]]) == set(DGX_NVSWITCHES)
    assert view.switch_remotes == set(DGX_NVSWITCHES)
    # a link whose far end NVML cannot name counts for nothing, unless NVML types it as an NVSwitch
    nvml = pcie_nvml({0: 1})

    def unnamed(h: int, link: int) -> Any:
        raise NVMLError(999)

    nvml.nvmlDeviceGetNvLinkRemotePciInfo = unnamed  # type: ignore[method-assign]
    host, _ = pcie
    topo = pp.read_topology(HostRoot(host.root))
    view = t.read_nvlinks(nvml, {PCIE_GPUS[0]: 0, PCIE_GPUS[1]: 1})
    assert view.nvlinks[PCIE_GPUS[0]] == ["unknown"] * 4 and view.errors
    assert pp.nvlink_count(topo, view.nvlinks, PCIE_GPUS[0], PCIE_GPUS[1], view.switch_remotes) == 0
    for g in nvml.tgpus:
        g.remote_type = 2
    view = t.read_nvlinks(nvml, {PCIE_GPUS[0]: 0, PCIE_GPUS[1]: 1})
    assert pp.nvlink_count(topo, view.nvlinks, PCIE_GPUS[0], PCIE_GPUS[1], view.switch_remotes) == 4


# -- NCCL_NET_GDR_LEVEL ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("level", "dist", "version", "reason", "gdr"), [
    # 2.6+: ncclGetLevel (paths.cc) -- names by strcmp, legacy integers through levelsOldToNew, else ignored
    ("PXB", "PIX", "2.21.5", None, True),
    ("PIX", "PXB", "2.21.5", "GDRDisabledByLevel", False),
    ("pxb", "PXB", "2.21.5", "InvalidLevel", True),  # case-sensitive: ignored, the default PXB applies
    ("NODE", "NODE", "2.21.5", "InvalidLevel", False),  # nvidia-smi's word; NCCL has no NODE (its PHB)
    ("PHB", "NODE", "2.21.5", None, True),
    (" PHB", "PHB", "2.21.5", "InvalidLevel", False),
    ("", "PIX", "2.21.5", "InvalidLevel", True),
    ("2", "PXB", "2.21.5", "IntegerLevel", True),  # old 2 -> PATH_PXB
    ("1", "PXB", "2.21.5", "GDRDisabledByLevel", False),  # old 1 -> PATH_PIX
    ("0x3", "PHB", "2.21.5", "IntegerLevel", True),  # strtol base 0: hex
    ("010", "SYS", "2.21.5", "IntegerLevel", True),  # octal 8, clamped to old 5 -> SYS
    ("3abc", "PHB", "2.21.5", "IntegerLevel", True),  # strtol stops at 'a'
    ("4294967297", "PXB", "2.21.5", "GDRDisabledByLevel", False),  # stored in an int: 1 -> PIX
    ("2147483648", "PIX", "2.21.5", "GDRDisabledByLevel", False),  # int -2^31: undefined table read
    ("PXN", "PXB", "2.11.4", "InvalidLevel", True),  # PATH_PXN arrived in 2.12
    ("PXN", "PHB", "2.12.12", "GDRDisabledByLevel", False),
    ("NVB", "PIX", "2.7.8", "InvalidLevel", True),  # PATH_NVB arrived in 2.8
    ("C2C", "PIX", "2.25.1", "InvalidLevel", True),
    ("C2C", "PIX", "2.26.2", "GDRDisabledByLevel", False),  # C2C sits below PIX
    ("P2C", "PXB", "2.27.3", None, True),
    ("LOC", "PIX", None, "GDRDisabledByLevel", False),
    ("SYS", "SYS", "NCCL version 2.30.7+cuda12.9", None, True),
    # 2.4-2.5: NCCL_PARAM strtoll, exclusive; a name reads as 0 and turns GDR off everywhere
    ("PXB", "PIX", "2.5.7", "GDRDisabledByLevel", False),
    ("2", "PXB", "2.4.8", None, True),
    ("3", "NODE", "2.5.6", "GDRDisabledByLevel", False),
    ("4", "NODE", "2.5.6", None, True),
    ("99999999999999999999", "PIX", "2.4.8", "InvalidLevel", True),  # ERANGE: 'Invalid value', default PHB
    ("PXB", "PIX", "2.3.7", "NotReadByThisVersion", None),
])
def test_gdr_level_finding(level: str, dist: str, version: str | None, reason: str | None,
                           gdr: bool | None) -> None:
    f = ncclp.gdr_level_finding(level, dist, version)
    assert (f.reason if f else None) == reason
    if f is not None:
        assert f.type == "NCCLGDRLevel" and f.suggested_action == "fix_config"
        if gdr is not None:
            assert f.details["gdr"] is gdr
    else:
        assert ncclp.gdr_enabled(ncclp.parse_gdr_level(level, ncclp.parse_nccl_version(version)).effective,
                             ncclp._nccl_distance(dist, ncclp.parse_nccl_version(version)), ncclp.parse_nccl_version(version)) \
               is gdr


def test_gdr_defaults_and_bad_distance() -> None:
    assert ncclp.nccl_default_gdr_level((2, 21, 5)) == "PXB" and ncclp.nccl_default_gdr_level((2, 29, 2)) == "P2C"
    assert ncclp.nccl_ladder((2, 27, 3)).index("PXN") < ncclp.nccl_ladder((2, 27, 3)).index("P2C")
    assert ncclp.nccl_ladder((2, 27, 5)).index("P2C") < ncclp.nccl_ladder((2, 27, 5)).index("PXN")
    for bad in ("X", "NV18", "banana"):
        with pytest.raises(ValueError):
            ncclp.gdr_level_finding("PXB", bad, "2.21.5")


@settings(max_examples=300, deadline=None)
@given(level=st.text(max_size=40), version=st.one_of(st.none(), st.text(max_size=30),
                                                    st.tuples(st.integers(2, 2), st.integers(0, 40),
                                                              st.integers(0, 12)).map(lambda v: ".".join(map(str, v)))),
       dist=st.sampled_from(["PIX", "PXB", "PHB", "NODE", "SYS"]))
def test_gdr_level_parser_never_raises(level: str, version: str | None, dist: str) -> None:
    v = ncclp.parse_nccl_version(version)
    parsed = ncclp.parse_gdr_level(level, v)
    assert parsed.effective in (*ncclp.nccl_ladder(v), None, "NONE")
    f = ncclp.gdr_level_finding(level, dist, version)
    assert f is None or (f.type == "NCCLGDRLevel" and f.message)
    if f is None:  # no finding: a name NCCL accepts, at least as loose as the distance
        assert parsed.form == "name" or (parsed.form == "integer" and ncclp.nccl_ladder(v) is ncclp.OLD_LADDER)


# -- properties of the distances ---------------------------------------------------------------------------

@st.composite
def trees(draw: st.DrawFn) -> tuple[Topology, list[str]]:
    """Random PCIe forests: host bridges (NUMA 0, 1 or unknown) with root ports, root-complex endpoints,
    nested switches and multi-function devices."""
    topo = Topology()
    buses = itertools.count(1)
    leaves: list[str] = []

    def node(bdf: str, hb: str, chain: tuple[str, ...], numa: int | None, leaf: bool) -> None:
        topo.nodes[bdf] = PciNode(bdf, hb, chain, vendor=0x10DE, klass=0x030200 if leaf else 0x060400,
                                  numa_node=numa)
        if leaf:
            leaves.append(bdf)

    def below(hb: str, numa: int | None, chain: tuple[str, ...], depth: int) -> None:
        what = draw(st.sampled_from(["device", "multifunction", "switch"] if depth < 3 else ["device"]))
        bus = next(buses)
        if what == "switch":
            usp = f"0000:{bus:02x}:00.0"
            node(usp, hb, (*chain, usp), numa, False)
            dbus = next(buses)
            for d in range(draw(st.integers(1, 3))):
                dsp = f"0000:{dbus:02x}:{d:02x}.0"
                node(dsp, hb, (*chain, usp, dsp), numa, False)
                below(hb, numa, (*chain, usp, dsp), depth + 1)
        else:
            for fn in range(draw(st.integers(2, 3)) if what == "multifunction" else 1):
                dev = f"0000:{bus:02x}:00.{fn}"
                node(dev, hb, (*chain, dev), numa, True)

    for h in range(draw(st.integers(1, 3))):
        hb, numa = f"pci0000:{0xc0 + h:02x}", draw(st.sampled_from([0, 1, None]))
        for r in range(draw(st.integers(1, 3))):
            bdf = f"0000:{0xc0 + h:02x}:{r:02x}.0"
            if draw(st.booleans()):
                node(bdf, hb, (bdf,), numa, False)
                below(hb, numa, (bdf,), 0)
            else:
                node(bdf, hb, (bdf,), numa, True)  # a root-complex integrated endpoint
    return topo, leaves


def _nearest_switch(topo: Topology, bdf: str) -> str | None:
    chain = topo.nodes[bdf].chain
    usps = [chain[i] for i in range(1, len(chain) - 1) if i % 2 == 1]
    return usps[-1] if usps else None


@settings(max_examples=200, deadline=None)
@given(trees())
def test_distance_properties(tree: tuple[Topology, list[str]]) -> None:
    topo, leaves = tree
    for a, b in itertools.product(leaves, repeat=2):
        d = pp.pcie_distance(topo, a, b)
        assert d == pp.pcie_distance(topo, b, a), "symmetric"
        assert (d == "X") == (a == b), "X exactly on the diagonal"
        na, nb = topo.nodes[a], topo.nodes[b]
        if a == b:
            continue
        if na.host_bridge != nb.host_bridge:
            assert d in ("NODE", "SYS") and (d == "NODE") == (na.numa_node is not None and
                                                              na.numa_node == nb.numa_node)
        elif na.chain[0] != nb.chain[0]:
            assert d == "PHB"
        else:
            assert d in ("PIX", "PXB")
        if _nearest_switch(topo, a) is not None and _nearest_switch(topo, a) == _nearest_switch(topo, b):
            assert d == "PIX", "two devices behind one switch"
    for a, b, c in itertools.permutations(leaves, 3):
        same_switch = _nearest_switch(topo, a) is not None and _nearest_switch(topo, a) == _nearest_switch(topo, b)
        other_root = (topo.nodes[a].host_bridge, topo.nodes[a].chain[0]) != (topo.nodes[c].host_bridge,
                                                                               topo.nodes[c].chain[0])
        if same_switch and other_root:
            assert pp.rank(pp.pcie_distance(topo, a, b)) <= pp.rank(pp.pcie_distance(topo, a, c))
        if pp.rank(pp.pcie_distance(topo, a, b)) < pp.rank(pp.pcie_distance(topo, a, c)):
            # not closer to c than b through NCCL's eyes either (NCCL only merges levels, never splits them)
            assert pp.rank(_smi(ncclp.nccl_path(topo, a, b))) <= pp.rank(_smi(ncclp.nccl_path(topo, a, c)))


def _smi(nccl: str) -> str:
    return {"LOC": "X"}.get(nccl, nccl)


@settings(max_examples=100, deadline=None)
@given(trees(), st.data())
def test_nvlink_counts_are_symmetric_and_only_between_gpus(tree: tuple[Topology, list[str]],
                                                           data: st.DataObject) -> None:
    topo, leaves = tree
    nvlinks = {g: data.draw(st.lists(st.sampled_from([*leaves, "0000:ff:00.0"]), max_size=6)) for g in leaves}
    m = t.matrix(topo, nvlinks)
    for ra, row in m.items():
        for rb, cell in row.items():
            assert cell == m[rb][ra]
            if cell.startswith("NV"):
                assert ra.startswith("GPU") and rb.startswith("GPU") and int(cell[2:]) > 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_written_tree_reads_back_exactly(tree: tuple[Topology, list[str]]) -> None:
    """A random tree written the way the kernel lays out sysfs reads back with the same chains and
    distances (the reader, not only the distance functions, under test)."""
    model, leaves = tree
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        bus = root / "sys/bus/pci/devices"
        bus.mkdir(parents=True)
        for bdf, n in model.nodes.items():
            real = root / "sys/devices" / n.host_bridge / "/".join(n.chain)
            real.mkdir(parents=True, exist_ok=True)
            (real / "vendor").write_text("0x10de\n")
            (real / "class").write_text(f"0x{n.klass:06x}\n")
            (real / "numa_node").write_text(f"{-1 if n.numa_node is None else n.numa_node}\n")
            (bus / bdf).symlink_to(os.path.relpath(real, bus))
        got = pp.read_topology(HostRoot(root))
        assert got.skipped == [] and got.bad_values == []
        assert {b: (n.host_bridge, n.chain, n.numa_node) for b, n in got.nodes.items()} == \
               {b: (n.host_bridge, n.chain, n.numa_node) for b, n in model.nodes.items()}
        for a, b in itertools.combinations(leaves, 2):
            assert pp.pcie_distance(got, a, b) == pp.pcie_distance(model, a, b)


# -- parsers --------------------------------------------------------------------------------------------

@given(st.frozensets(st.integers(0, pp.MAX_CPU), max_size=300))
def test_cpulist_round_trip(cpus: frozenset[int]) -> None:
    assert pp.parse_cpulist(pp.format_cpulist(cpus)) == cpus


@settings(max_examples=500)
@given(st.one_of(st.text(max_size=60), st.binary(max_size=60).map(lambda b: b.decode("latin-1"))))
def test_parsers_never_raise_and_stay_in_bounds(text: str) -> None:
    cpus = pp.parse_cpulist(text)
    assert cpus is None or all(0 <= c <= pp.MAX_CPU for c in cpus)
    assert pp.parse_numa(text) is None or 0 <= pp.parse_numa(text) <= 4095  # type: ignore[operator]
    s = pp.parse_link_speed(text)
    assert s is None or 0 < s <= 256
    w = pp.parse_link_width(text)
    assert w is None or 0 <= w <= 32
    h = pp.parse_hex(text, 16)
    assert h is None or 0 <= h < 1 << 16
    assert ncclp.parse_nccl_version(text) is None or len(ncclp.parse_nccl_version(text)) == 3  # type: ignore[arg-type]


def test_parsers_on_kernel_strings() -> None:
    # drivers/pci/probe.c pci_speed_string (>= 5.7) and the older pci-sysfs.c strings
    assert [pp.parse_link_speed(s) for s in ("2.5 GT/s PCIe", "8.0 GT/s PCIe", "32.0 GT/s PCIe\n", "64.0 GT/s PCIe",
                                            "8 GT/s", "Unknown", "Unknown speed", "32 GT/s PCIE")] == \
           [2.5, 8.0, 32.0, 64.0, 8.0, None, None, None]
    assert pp.parse_numa("-1\n") is None and pp.parse_numa("1\n") == 1
    assert pp.parse_cpulist("0-55,112-167\n") == frozenset([*range(56), *range(112, 168)])
    assert pp.parse_cpulist("\n") == frozenset() and pp.parse_cpulist("3-1") is None
    assert pp.parse_hex("0x030200\n", 24) == 0x030200 and pp.parse_hex("0x1000000", 24) is None
    assert sorted(["mlx5_10", "mlx5_bond_0", "mlx5_2", "mlx5_1"], key=pp.natural_key) == \
           ["mlx5_1", "mlx5_2", "mlx5_10", "mlx5_bond_0"]


def test_finding_policy_table_is_the_documented_one() -> None:
    """docs/topology.md's findings table lists exactly TOPOLOGY_FINDINGS (type, reason, severity, action)."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "topology.md").read_text()
    types = {ty for ty, _ in TOPOLOGY_FINDINGS}
    rows = set()
    for line in doc.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0] in types:  # | type | reason | severity | action | when |
            rows.add((cells[0], cells[1], cells[2], cells[3]))
    assert rows == {(ty, why, v.severity, v.action) for (ty, why), v in TOPOLOGY_FINDINGS.items()}


def test_collector_keeps_the_plugin_contract() -> None:
    from gna_sdk import collector_contract

    assert collector_contract(TopologyCollector) == []
    assert callable(TopologyCollector.report) and callable(TopologyCollector.render_text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.sampled_from(["rel", "abs", "dir", "dangle"])),
                min_size=1, max_size=12))
def test_the_kernels_realpath_is_pythons(tmp_path_factory: pytest.TempPathFactory,
                                         links: list[tuple[int, int, str]]) -> None:
    """pcie_tree.kernel_realpath (O_PATH, then /proc/self/fd) names what os.path.realpath(strict=True) names,
    and fails where it fails (a loop, a dangling link), for chains of links relative, absolute and through
    directories."""
    root = tmp_path_factory.mktemp("rp")
    (root / "d0" / "d1").mkdir(parents=True)
    (root / "d0" / "d1" / "f").write_text("x")
    for i, (src, dst, kind) in enumerate(links):
        at = root / f"l{src}_{i}"
        target = {"rel": f"l{dst}_{max(i - 1, 0)}", "abs": str(root / "d0" / "d1" / "f"),
                  "dir": "d0/../d0/d1", "dangle": "nowhere/at/all"}[kind]
        with contextlib.suppress(FileExistsError):
            at.symlink_to(target)
    for p in [*root.iterdir(), root / "d0" / "d1" / "f"]:
        for path in (str(p), str(p / "f")):
            try:
                want: str | None = os.path.realpath(path, strict=True)
            except OSError:
                want = None
            try:
                got: str | None = pp.kernel_realpath(path)
            except OSError:
                got = None
            assert got == want, path
