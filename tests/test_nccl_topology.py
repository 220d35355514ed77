"""NCCL ranks against the node's PCIe tree (docs/topology.md, "NCCL ranks and the tree"): NCCLFarNIC (a rank whose
own channels use a NIC farther than its GPU's nearest one) and NCCLGDRLevel (NCCL_NET_GDR_LEVEL tighter than the
GPU-NIC distance, or a legacy integer), raised by nccl_logs through `gpu-node-agent check`.

The trees are sim/topology.py's (a DGX H100 whose `nvidia-smi topo -m` is public; 8 PCIe GPUs with one dual-port
NIC); the log lines are rendered from NCCL's own format strings (NVIDIA/nccl v2.21.5-1 unless said), so what
the parser reads is what NCCL prints.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import config as configmod
from agent.check import check_roots
from collectors.formats import pcie_tree as pp
from collectors.nccl import rank_paths as ncclp
from collectors.nccl.line import parse_line
from collectors.nccl.matching import match_line
from collectors.nccl.prefilter import candidate_lines
from collectors.nccl.process import ProcessState
from gna_sdk.hostroot import HostRoot
from gna_types.policy import NCCL_PATH_FINDINGS
from sim.host import SimHost
from sim.topology import DGX_COMPUTE_NICS, DGX_GPUS, PCIE_GPUS, dgx_h100, pcie_8gpu
from tests.conftest import validate_message

HOST = "dgx-01"
PID = 4242
# DGX H100 user guide's compute NICs, GPU0..GPU7
COMPUTE = [hca for _bdf, hca, _netdev in DGX_COMPUTE_NICS]

# -- NCCL's format strings -----------------------------------------------------------------------------------
# src/init.cc VERSION_STRING: "NCCL version " MAJOR "." MINOR "." PATCH SUFFIX "+cuda" CUDA_MAJOR "." CUDA_MINOR
VERSION = "NCCL version %s+cuda12.4"
# src/transport/net_ib.cc ncclIbInit: INFO "NET/IB : Using%s %s; OOB %s:%s" of " [%d]%s:%d/%s" per device
USING = "NET/IB : Using%s %s; OOB %s:%s"
DEVICE = " [%d]%s:%d/%s"
HCA_SET = "NCCL_IB_HCA set to %s"
# src/transport/net.cc sendSetup / recvSetup
SEND = "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s"
SEND_PXN = "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d(%d)%s%s"
RECV = "Channel %02d/%d : %d[%d] -> %d[%d] [receive] via NET/%s/%d%s%s"
# src/init.cc: "%p" and "%lx"/"%llx" written out as NCCL renders them
INIT = "ncclCommInitRank comm 0x%x rank %d nranks %d cudaDev %d nvmlDev %d busId %x commId 0x%x - Init COMPLETE"
# src/graph/paths.cc ncclGetLevel: the level NCCL made of the value, by name
LEVEL_SET = "%s set by environment to %s"
# NCCL 2.5.6: src/include/param.h "%s set by environment to %lu.", src/transport/net.cc "Ring %02d : %d[%lx] -> %d[%lx]
# [send] via NET/%s/%d%s", src/init.cc "comm %p rank %d nranks %d cudaDev %d busId %x - Init COMPLETE"
OLD_PARAM = "%s set by environment to %d."
OLD_RING = "Ring %02d : %d[%x] -> %d[%x] [%s] via NET/%s/%d%s"
OLD_INIT = "comm 0x%x rank %d nranks %d cudaDev %d busId %x - Init COMPLETE"


def nccl_bus(bdf: str) -> int:
    """NCCL's int64 busId of a PCI address ("0000:1b:00.0" -> 0x1b000), which it prints with %lx."""
    return int(bdf.replace(":", "").replace(".", ""), 16)


def job_log(*, gpu: int, bus: str, devices: list[str], channels: list[tuple[str, int, int | None]],
            version: str = "2.21.5", hca: str | None = None, echo: dict[str, str] | None = None,
            rank: int = 0, host: str = HOST, pid: int = PID) -> str:
    """One rank's NCCL_DEBUG=INFO log. ``channels``: (send|receive, NCCL device index, PXN proxy rank or None)."""
    pre = f"{host}:{pid}:{pid + 9} [{gpu}] NCCL INFO "
    lines = [pre + VERSION % version]
    if hca is not None:
        lines.append(pre + HCA_SET % hca)
    lines.append(pre + USING % ("".join(DEVICE % (i, d, 1, "IB") for i, d in enumerate(devices)), "",
                                "ibp24s0", "10.0.0.1<0>"))
    lines += [pre + LEVEL_SET % kv for kv in (echo or {}).items()]
    lines.append(pre + "Using network IB")
    peer = rank + 8
    for c, (direction, dev, proxy) in enumerate(channels):
        if direction == "receive":
            lines.append(pre + RECV % (c, 0, peer, gpu, rank, gpu, "IB", dev, "/GDRDMA", ""))
        elif proxy is None:
            lines.append(pre + SEND % (c, 0, rank, gpu, peer, gpu, "IB", dev, "/GDRDMA", ""))
        else:
            lines.append(pre + SEND_PXN % (c, 0, rank, gpu, peer, gpu, "IB", dev, proxy, "/GDRDMA", ""))
    lines.append(pre + INIT % (0x55D1C0A0B0C0, rank, 16, gpu, gpu, nccl_bus(bus), 0x7E57AB1E5C0FFEE))
    return "\n".join(lines) + "\n"


def place(host: SimHost, log: str, *, environ: dict[str, str] | None = None, pid: int = PID,
          name: str = HOST) -> None:
    host.write("/proc/sys/kernel/hostname", f"{name}\n")
    host.write("/etc/hostname", f"{name}\n")
    host.write(f"/var/log/nccl/{name}.{pid}.log", log)
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/var/log/nccl/%h.%p.log", **(environ or {})}
    host.write(f"/proc/{pid}/environ", "".join(f"{k}={v}\0" for k, v in env.items()) + "PATH=/usr/bin\0")
    host.write(f"/proc/{pid}/comm", "python3\n")


def check(root: Path, toml: str = "") -> dict[str, Any]:
    base = configmod.parse(toml, file="<test>")
    (report,) = asyncio.run(check_roots([root], base))
    for m in [*report["conditions"], *report["events"]]:
        validate_message(m)
    return report  # type: ignore[no-any-return]


def of(report: dict[str, Any], type_: str) -> list[dict[str, Any]]:
    return [c for c in report["conditions"] if c["type"] == type_]


@pytest.fixture
def dgx(tmp_path: Path) -> SimHost:
    host, _ = dgx_h100(tmp_path / "dgx")
    return host


# -- NCCLFarNIC through `check` ----------------------------------------------------------------------------------

def test_a_rank_on_its_rail_nic_is_healthy(dgx: SimHost) -> None:
    hca = "=" + ",".join(COMPUTE)
    place(dgx, job_log(gpu=0, bus=DGX_GPUS[0], devices=COMPUTE, hca=hca,
                       channels=[("receive", 0, None), ("send", 0, None), ("receive", 0, None)]),
          environ={"NCCL_IB_HCA": hca})
    report = check(dgx.root)
    assert of(report, "NCCLFarNIC") == [] and of(report, "NCCLGDRLevel") == []
    assert not any(n["source"].startswith("PCIe topology") for n in report["not_seen"])


def test_nccl_ib_hca_pinned_to_the_other_socket_puts_gpu0_on_a_sys_nic(dgx: SimHost) -> None:
    """NCCL_IB_HCA names only socket 1's NICs: NCCL lists [0]mlx5_6 [1]mlx5_9 [2]mlx5_10 [3]mlx5_11, so NET/IB/3
    is mlx5_11 (NCCL's own index), not mlx5_3; GPU0's PIX NIC mlx5_0 is ACTIVE and never listed."""
    pinned = ["mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
    hca = "=" + ",".join(pinned)
    place(dgx, job_log(gpu=0, bus=DGX_GPUS[0], devices=pinned, hca=hca,
                       channels=[("receive", 0, None), ("send", 0, None), ("receive", 3, None)]))
    report = check(dgx.root)
    (c,) = of(report, "NCCLFarNIC")
    assert (c["entity"], c["reason"], c["severity"], c["suggested_action"]) == (
        f"nccl:{HOST}:{PID}", "NearestNICNotSelected", "warning", "fix_config")
    d = c["details"]
    assert d["gpu"] == DGX_GPUS[0] and d["gpu_label"] == "GPU0"
    assert d["used_nics"] == {"mlx5_6": "SYS", "mlx5_11": "SYS"} and "mlx5_3" not in d["used_nics"]
    assert (d["used_distance"], d["nearest_distance"]) == ("SYS", "PIX")
    assert d["nearest_nics"] == ["mlx5_0", "mlx5_1", "mlx5_2"]  # the compute NIC and the storage NIC's two ports
    assert d["nearest_state"]["mlx5_0"] == "not listed by NCCL" and d["nccl_ib_hca"] == hca
    assert "excluded by NCCL_IB_HCA" in c["message"] and "GPU0" in c["message"]
    assert d["ranks"] == [0] and d["pci"] == DGX_GPUS[0]  # the process summary, as on every NCCL message


def test_a_rail_nic_that_is_down_makes_nccl_fall_back_far(dgx: SimHost) -> None:
    """mlx5_0's port is down: NCCL lists only ACTIVE ports (net_ib.cc), so GPU0's rank lands on another rail."""
    dgx.set_port("mlx5_0", 1, state="1: DOWN", phys_state="3: Disabled")
    hca = "=" + ",".join(COMPUTE)
    listed = COMPUTE[1:]  # mlx5_3 .. mlx5_11 as [0]..[6]
    place(dgx, job_log(gpu=0, bus=DGX_GPUS[0], devices=listed, hca=hca,
                       channels=[("receive", 3, None), ("send", 3, None)]), environ={"NCCL_IB_HCA": hca})
    report = check(dgx.root)
    (c,) = of(report, "NCCLFarNIC")
    assert (c["reason"], c["severity"], c["suggested_action"]) == ("NearestNICDown", "warning", "inspect_hardware")
    assert c["details"]["used_nics"] == {"mlx5_6": "SYS"} and c["details"]["nearest_state"]["mlx5_0"] == "port down"
    assert "mlx5_0 has no ACTIVE port" in c["message"]
    assert any(i["type"] == "IBPortDown" for i in report["conditions"])  # the infiniband collector's own view


def test_a_nearest_nic_nccl_listed_but_did_not_use(dgx: SimHost) -> None:
    place(dgx, job_log(gpu=0, bus=DGX_GPUS[0], devices=COMPUTE, channels=[("receive", 1, None)]))
    (c,) = of(check(dgx.root), "NCCLFarNIC")
    assert (c["reason"], c["details"]["used_nics"]) == ("NearestNICUnused", {"mlx5_3": "NODE"})
    assert c["details"]["nearest_state"]["mlx5_0"] == "listed by NCCL"


def test_pxn_sends_through_another_gpus_nic_are_not_far(dgx: SimHost) -> None:
    """net.cc prints "(proxyRank)" after the device for a PXN send: the data crosses NVLink to the proxy GPU and
    leaves on that GPU's NIC, so mlx5_6 (SYS to GPU0) is not this rank's own NIC."""
    place(dgx, job_log(gpu=0, bus=DGX_GPUS[0], devices=COMPUTE,
                       channels=[("receive", 0, None), ("send", 4, 4), ("send", 7, 7)]))
    report = check(dgx.root)
    assert of(report, "NCCLFarNIC") == []
    # the same channels without the proxy rank would be far
    place(dgx, job_log(gpu=0, bus=DGX_GPUS[0], devices=COMPUTE,
                       channels=[("receive", 0, None), ("send", 4, None)]))
    (c,) = of(check(dgx.root), "NCCLFarNIC")
    assert c["details"]["far_nics"] == ["mlx5_6"]


def test_storage_hcas_never_count_as_nearest(dgx: SimHost) -> None:
    """With the storage NIC's ports configured as storage, GPU0's only nearest NIC is mlx5_0: when it is down,
    the reason is the down NIC, not a storage port NCCL_IB_HCA rightly leaves out."""
    dgx.set_port("mlx5_0", 1, state="1: DOWN", phys_state="3: Disabled")
    hca = "=" + ",".join(COMPUTE)
    place(dgx, job_log(gpu=0, bus=DGX_GPUS[0], devices=COMPUTE[1:], hca=hca, channels=[("receive", 0, None)]))
    (c,) = of(check(dgx.root, '[collectors.nccl_logs]\nstorage_hcas = ["mlx5_1", "mlx5_2"]\n'), "NCCLFarNIC")
    assert c["reason"] == "NearestNICDown" and c["details"]["nearest_nics"] == ["mlx5_0"]


def test_no_pci_tree_means_no_finding_and_says_so(tmp_path: Path) -> None:
    host = SimHost(tmp_path / "bare")
    host.root.mkdir()
    place(host, job_log(gpu=0, bus=DGX_GPUS[0], devices=COMPUTE[4:], channels=[("receive", 0, None)]),
          environ={"NCCL_NET_GDR_LEVEL": "LOC"})
    report = check(host.root)
    assert of(report, "NCCLFarNIC") == [] and of(report, "NCCLGDRLevel") == []
    seen = {n["source"]: n["reason"] for n in report["not_seen"] if n["collector"] == "nccl_logs"}
    assert "/sys/bus/pci/devices is missing" in seen["PCIe topology (NCCL ranks' NICs)"]


def test_a_gpu_without_its_nics_in_the_tree_is_not_judged(tmp_path: Path) -> None:
    """GPUs on the bus, HCAs without a device link into the PCI tree (class directories only, as a
    capture like procfs' fixtures has them): nothing to measure the rank's NICs against."""
    host = SimHost.gpu_node(tmp_path / "flat", gpus=8)
    for i in range(8):
        host.add_hca(f"mlx5_{i}")
    place(host, job_log(gpu=0, bus="0000:18:00.0", devices=[f"mlx5_{i}" for i in range(8)],
                        channels=[("receive", 7, None)]))
    report = check(host.root)
    assert of(report, "NCCLFarNIC") == []
    seen = {n["source"]: n["reason"] for n in report["not_seen"] if n["collector"] == "nccl_logs"}
    assert "no RDMA device" in seen["PCIe topology (NCCL ranks' NICs)"]
    # and a rank whose GPU is not on this node's bus at all
    place(host, job_log(gpu=0, bus="0000:77:00.0", devices=[f"mlx5_{i}" for i in range(8)],
                        channels=[("receive", 7, None)]))
    seen = {n["source"]: n["reason"] for n in check(host.root)["not_seen"] if n["collector"] == "nccl_logs"}
    assert "GPU 0000:77:00.0 is not on this node's PCI bus" in seen["PCIe topology (NCCL ranks' NICs)"]


def test_a_merged_nic_list_is_not_read_index_for_index(dgx: SimHost) -> None:
    """2.19-2.22 print a merged NIC as " [d]={[i] a:1/IB, [j] b:1/IB}" and the others by physical index, while a
    channel's NET/IB/<n> counts merged devices (net_ib.cc ncclIbInit, v2.21.5-1): with the storage NIC's two
    ports merged, GPU2's NET/IB/3 is mlx5_4, its PIX NIC, though the list shows [3] as mlx5_3. No guess."""
    plain = " [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB [4]mlx5_4:1/IB"
    merged = " [0]mlx5_0:1/IB [1]={[1] mlx5_1:1/IB, [2] mlx5_2:1/IB} [3]mlx5_3:1/IB [4]mlx5_4:1/IB"
    log = job_log(gpu=2, bus=DGX_GPUS[2], devices=["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4"],
                  channels=[("receive", 3, None)])
    assert plain in log
    place(dgx, log)  # read as printed, NET/IB/3 is mlx5_3, NODE to GPU2: far
    (c,) = of(check(dgx.root), "NCCLFarNIC")
    assert c["details"]["used_nics"] == {"mlx5_3": "NODE"}
    place(dgx, log.replace(plain, merged))
    assert of(check(dgx.root), "NCCLFarNIC") == []


# -- NCCLGDRLevel through `check` --------------------------------------------------------------------------------

@pytest.fixture
def pcie(tmp_path: Path) -> SimHost:
    host, _ = pcie_8gpu(tmp_path / "pcie")
    return host


def test_a_gdr_level_tighter_than_the_distance_turns_gdr_off(pcie: SimHost) -> None:
    """GPU4 and mlx5_0 share socket 1 but not a switch: NODE to nvidia-smi, PHB to NCCL. PXB is tighter."""
    place(pcie, job_log(gpu=4, bus=PCIE_GPUS[4], devices=["mlx5_0", "mlx5_1"], channels=[("receive", 0, None)]),
          environ={"NCCL_NET_GDR_LEVEL": "PXB"})
    report = check(pcie.root)
    (c,) = of(report, "NCCLGDRLevel")
    assert (c["entity"], c["reason"], c["severity"], c["suggested_action"]) == (
        f"nccl:{HOST}:{PID}", "GDRDisabledByLevel", "warning", "fix_config")
    d = c["details"]
    assert (d["gpu"], d["nic"], d["gpu_nic_distance"], d["effective_level"], d["gdr"]) == (
        PCIE_GPUS[4], "mlx5_0", "PHB", "PXB", False)
    assert d["nccl_version"] == "2.21.5+cuda12.4" and "GPU4" in c["message"]
    assert of(report, "NCCLFarNIC") == []  # both ports are equally near: nothing closer was passed over
    # PHB or SYS reach it: nothing to say
    for level in ("PHB", "SYS"):
        place(pcie, job_log(gpu=4, bus=PCIE_GPUS[4], devices=["mlx5_0"], channels=[("receive", 0, None)]),
              environ={"NCCL_NET_GDR_LEVEL": level})
        assert of(check(pcie.root), "NCCLGDRLevel") == [], level


def test_the_log_echo_is_used_when_the_environment_is_out_of_reach(pcie: SimHost) -> None:
    """A pod's pid is not the host's: its log's "NCCL_NET_GDR_LEVEL set by environment to PXB" is the level."""
    log = job_log(gpu=4, bus=PCIE_GPUS[4], devices=["mlx5_0"], channels=[("receive", 0, None)], host="trainer-0",
                  echo={"NCCL_NET_GDR_LEVEL": "PXB"})
    pcie.write("/var/log/nccl/trainer-0.17.log", log)
    pcie.write("/proc/sys/kernel/hostname", f"{HOST}\n")
    pcie.p("/var/log/pods/team-a_trainer-0_5d0c8a9e-1b2f-4c3d-8e7f-0a1b2c3d4e5f/trainer").mkdir(parents=True)
    (c,) = of(check(pcie.root), "NCCLGDRLevel")
    assert c["entity"] == "nccl:trainer-0:4242" and c["reason"] == "GDRDisabledByLevel"


def test_a_legacy_integer_level_is_reported(dgx: SimHost) -> None:
    """2 is levelsOldToNew[2] = PXB (paths.cc): GPUDirect RDMA stays on for a PIX NIC, but the integer is one
    NCCL's logs no longer speak; 0 is LOC, tighter than any NIC."""
    place(dgx, job_log(gpu=0, bus=DGX_GPUS[0], devices=COMPUTE, channels=[("receive", 0, None)],
                       echo={"NCCL_NET_GDR_LEVEL": "PXB"}), environ={"NCCL_NET_GDR_LEVEL": "2"})
    report = check(dgx.root)
    (c,) = of(report, "NCCLGDRLevel")
    assert (c["reason"], c["details"]["parsed_as"], c["details"]["effective_level"], c["details"]["gdr"]) == (
        "IntegerLevel", "integer", "PXB", True)
    (env,) = [e for e in report["conditions"] if e["entity"] == f"proc:{PID}/NCCL_NET_GDR_LEVEL"]
    assert (env["type"], env["reason"]) == ("NCCLEnvMisconfigured", "IntegerLevel")  # nccl_env's lint of it
    place(dgx, job_log(gpu=0, bus=DGX_GPUS[0], devices=COMPUTE, channels=[("receive", 0, None)]),
          environ={"NCCL_NET_GDR_LEVEL": "0"})
    (c,) = of(check(dgx.root), "NCCLGDRLevel")
    assert (c["reason"], c["details"]["effective_level"]) == ("GDRDisabledByLevel", "LOC")


def test_the_nccl_version_decides_what_an_integer_means(pcie: SimHost) -> None:
    """3 under NCCL 2.5 is exclusive ("distance >= level" disables, net.cc): below PHB, so GPU4's NODE NIC loses
    GPUDirect RDMA; under 2.21 3 is PHB, which reaches it (and is only an IntegerLevel)."""
    pre = f"{HOST}:{PID}:{PID + 9} [4] NCCL INFO "
    old = "\n".join([pre + VERSION % "2.5.6", pre + USING.replace(" %s; OOB", " ; OOB") % (
        DEVICE % (0, "mlx5_0", 1, "IB"), "ibp202s0f0", "10.0.0.1<0>"),
        pre + OLD_PARAM % ("NCCL_NET_GDR_LEVEL", 3),
        pre + OLD_RING % (0, 8, nccl_bus(PCIE_GPUS[4]), 0, nccl_bus(PCIE_GPUS[4]), "receive", "IB", 0, ""),
        pre + OLD_INIT % (0x55D1C0A0B0C0, 0, 16, 4, nccl_bus(PCIE_GPUS[4]))]) + "\n"
    place(pcie, old)
    (c,) = of(check(pcie.root), "NCCLGDRLevel")
    assert (c["reason"], c["details"]["nccl_version"], c["details"]["gpu_nic_distance"]) == (
        "GDRDisabledByLevel", "2.5.6+cuda12.4", "NODE")  # 2.4-2.5 compare nvidia-smi's NODE
    place(pcie, job_log(gpu=4, bus=PCIE_GPUS[4], devices=["mlx5_0"], channels=[("receive", 0, None)]),
          environ={"NCCL_NET_GDR_LEVEL": "3"})
    (c,) = of(check(pcie.root), "NCCLGDRLevel")
    assert (c["reason"], c["details"]["effective_level"], c["details"]["gdr"]) == ("IntegerLevel", "PHB", True)


def test_a_level_nccl_ignores_is_invalid(dgx: SimHost) -> None:
    """ncclGetLevel compares with strcmp: 'pxb' is no level, NCCL keeps its default (PXB)."""
    place(dgx, job_log(gpu=0, bus=DGX_GPUS[0], devices=COMPUTE, channels=[("receive", 0, None)]),
          environ={"NCCL_NET_GDR_LEVEL": "pxb"})
    report = check(dgx.root)
    (c,) = of(report, "NCCLGDRLevel")
    assert (c["reason"], c["details"]["effective_level"], c["details"]["gdr"]) == ("InvalidLevel", "PXB", True)
    (env,) = [e for e in report["conditions"] if e["entity"] == f"proc:{PID}/NCCL_NET_GDR_LEVEL"]
    assert env["reason"] == "InvalidLevel"


# -- the pure functions ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dgx_topo(tmp_path_factory: pytest.TempPathFactory) -> pp.Topology:
    host, _ = dgx_h100(tmp_path_factory.mktemp("dgx") / "root")
    return pp.read_topology(HostRoot(host.root))


def test_far_nic_finding_on_the_dgx(dgx_topo: pp.Topology) -> None:
    everything = [n.name for n in dgx_topo.nics]
    for i, gpu in enumerate(DGX_GPUS):
        assert ncclp.far_nic_finding(dgx_topo, gpu, [COMPUTE[i]], listed=COMPUTE, active=everything) is None
    f = ncclp.far_nic_finding(dgx_topo, DGX_GPUS[7], ["mlx5_0"], listed=COMPUTE, active=everything)
    assert isinstance(f, pp.Finding) and f.reason == "NearestNICUnused"
    assert (f.details["used_distance"], f.details["nearest_nics"]) == ("SYS", ["mlx5_11"])
    assert ncclp.far_nic_finding(dgx_topo, DGX_GPUS[0], ["mlx5_99"], listed=[], active=[]) == ncclp.Unjudged(
        "mlx5_99 (named by NCCL) is no RDMA device of this node's PCI tree")
    assert isinstance(ncclp.far_nic_finding(dgx_topo, "0000:07:00.0", [], listed=[], active=[]), ncclp.Unjudged)


def test_hca_filter_is_ncclib_init_s() -> None:
    sel = ncclp.hca_filter_selects
    assert sel(None, "mlx5_0") and sel("", "mlx5_0") and sel(",", "mlx5_0")  # no entry: everything
    assert sel("mlx5_1", "mlx5_10") and not sel("=mlx5_1", "mlx5_10") and sel("=mlx5_1", "mlx5_1")
    assert not sel("^mlx5_1", "mlx5_10") and sel("^=mlx5_1", "mlx5_10") and not sel("^=mlx5_1", "mlx5_1")
    assert sel("mlx5_0:1", "mlx5_0", 1) and not sel("mlx5_0:2", "mlx5_0", 1) and sel("mlx5_0:2", "mlx5_0")
    # MAX_IB_DEVS entries are read: 16 before 2.19, 32 since
    many = ",".join(f"x{i}" for i in range(16)) + ",mlx5_0"
    assert sel(many, "mlx5_0") and not sel(many, "mlx5_0", version=(2, 18, 5))


NICS = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9",
        "mlx5_10", "mlx5_11"]


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gpu=st.sampled_from(DGX_GPUS), used=st.lists(st.sampled_from(NICS), max_size=4),
       listed=st.sets(st.sampled_from(NICS)), active=st.sets(st.sampled_from(NICS)),
       hca=st.one_of(st.none(), st.text(max_size=30)), exclude=st.sets(st.sampled_from(NICS), max_size=3))
def test_far_nic_fires_exactly_when_a_used_nic_is_farther_than_the_nearest(
        dgx_topo: pp.Topology, gpu: str, used: list[str], listed: set[str], active: set[str], hca: str | None,
        exclude: set[str]) -> None:
    f = ncclp.far_nic_finding(dgx_topo, gpu, used, listed=listed, active=active, hca_filter=hca, exclude=exclude)
    cands = [n for n in dgx_topo.nics if n.name not in exclude]
    if not cands:
        assert isinstance(f, ncclp.Unjudged)
        return
    best = min(pp.rank(pp.pcie_distance(dgx_topo, gpu, n.bdf)) for n in cands)
    far = any(pp.rank(pp.pcie_distance(dgx_topo, gpu, dgx_topo.resolve(u))) > best for u in used)
    assert (f is not None) is far
    if isinstance(f, pp.Finding):
        v = NCCL_PATH_FINDINGS[(f.type, f.reason)]
        assert (f.severity, f.suggested_action) == (v.severity, v.action)
        assert set(f.details["far_nics"]) <= set(used) and f.details["nearest_nics"]
        assert pp.rank(f.details["used_distance"]) > pp.rank(f.details["nearest_distance"])


@given(st.text(max_size=40), st.sampled_from(NICS), st.integers(-1, 3))
def test_hca_filter_never_raises_and_caret_negates(value: str, name: str, port: int) -> None:
    got = ncclp.hca_filter_selects(value, name, port)
    body = value[1:] if value.startswith("^") else value
    entries = [e for e in (body[1:] if body.startswith("=") else body).split(",") if e.partition(":")[0]]
    if not value.startswith("^") and entries:
        assert ncclp.hca_filter_selects("^" + value, name, port) is (not got)


@given(level=st.one_of(st.text(max_size=12), st.sampled_from(["PIX", "PXB", "PHB", "SYS", "LOC", "0", "5", "PXN"])),
       version=st.sampled_from([None, "2.5.6", "2.12.12", "2.21.5+cuda12.4", "2.27.5", "2.30.7"]),
       gpu=st.sampled_from(PCIE_GPUS), nics=st.lists(st.sampled_from(["mlx5_0", "mlx5_1"]), min_size=1, max_size=2))
@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_rank_gdr_finding_agrees_with_nccl_s_comparison(pcie_topo: pp.Topology, level: str, version: str | None,
                                                       gpu: str, nics: list[str]) -> None:
    f = ncclp.rank_gdr_finding(pcie_topo, gpu, nics, level, version)
    v = ncclp.parse_nccl_version(version)
    parsed = ncclp.parse_gdr_level(level, v)
    on = [ncclp.gdr_enabled(parsed.effective, ncclp._nccl_distance(
        ncclp.nccl_gpu_nic_distance(pcie_topo, gpu, n, v), v), v) for n in nics]
    if parsed.form == "name" and all(on):
        assert f is None
    if parsed.form != "unread" and not all(on):
        assert f is not None and f.reason in ("GDRDisabledByLevel", "InvalidLevel")
        assert f.details["gdr"] is False


@pytest.fixture(scope="module")
def pcie_topo(tmp_path_factory: pytest.TempPathFactory) -> pp.Topology:
    host, _ = pcie_8gpu(tmp_path_factory.mktemp("pcie") / "root")
    return pp.read_topology(HostRoot(host.root))


# -- what the parser reads ---------------------------------------------------------------------------------------

def _state(text: str) -> ProcessState:
    proc = ProcessState(HOST, PID, "x.log")
    for off, raw in candidate_lines(text.encode(), 0):
        m = match_line(parse_line(off, raw))
        if m is not None:
            proc.apply(m)
    return proc


def test_version_and_own_nics_from_the_log() -> None:
    p = _state(job_log(gpu=0, bus=DGX_GPUS[0], devices=COMPUTE, version="2.27.5",
                       channels=[("receive", 2, None), ("send", 5, 5)]))
    assert p.version == "2.27.5+cuda12.4"
    assert p.direct_nics() == ["mlx5_4"] and p.nics_used() == ["mlx5_4/1", "mlx5_9/1"]
    # the version line only with NCCL's prefix: a trainer's "NCCL version" text is no NCCL line
    assert _state("NCCL version 2.18.1+cuda12.1\n[rank0]: NCCL version 2.18.1\n").version == ""


@given(st.lists(st.tuples(st.sampled_from(["send", "receive"]), st.integers(0, 11),
                          st.one_of(st.none(), st.integers(0, 63))), max_size=12))
def test_pxn_sends_never_count_as_the_rank_s_own_nics(channels: list[tuple[str, int, int | None]]) -> None:
    chans = [(d, dev, proxy if d == "send" else None) for d, dev, proxy in channels]
    p = _state(job_log(gpu=0, bus=DGX_GPUS[0], devices=NICS, channels=chans))
    own = {NICS[dev] for d, dev, proxy in chans if proxy is None}
    assert (p.direct_nics() or []) == sorted(own, key=lambda n: int(n.split("_")[1]))
    assert {n.split("/")[0] for n in p.nics_used() or []} == {NICS[dev] for _d, dev, _p in chans}


@given(st.text(max_size=60))
def test_any_version_text_parses_or_is_left(text: str) -> None:
    p = _state(f"{HOST}:{PID}:1 [0] NCCL INFO NCCL version {text}\n")
    assert p.version == "" or (ncclp.parse_nccl_version(p.version) is not None and len(p.version) <= 51)


# -- the documented policy ---------------------------------------------------------------------------------------

def test_policy_tables_are_the_documented_ones() -> None:
    docs = Path(__file__).resolve().parent.parent / "docs"
    topo = (docs / "topology.md").read_text()
    section = topo.split("## 8.", 1)[1].split("\n## ", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0] in ("NCCLFarNIC", "NCCLGDRLevel"):
            rows.add((cells[0], cells[1], cells[2], cells[3]))
    assert rows == {(ty, why, v.severity, v.action) for (ty, why), v in NCCL_PATH_FINDINGS.items()}
    messages = (docs / "messages.md").read_text()
    assert "| `NCCLFarNIC` | condition | nccl_logs |" in messages
    assert "| `NCCLGDRLevel` | condition | nccl_logs |" in messages
