"""Pass/fail figures per SKU, the node's measured topology they are chosen by, and the config's overrides.

The anchor is Azure's published health checks, Azure/azurehpc-health-checks at
df20d06801dbe8461e7e5661223829109622143c (conf/*.conf, the last commit touching these four files):

============  ===================================  ==========================================================
SKU           file                                 lines
============  ===================================  ==========================================================
ND H100 v5    conf/nd96isr_h100_v5.conf            check_gpu_bw 48 335; check_nccl_allreduce 460.0 1 16G;
                                                   check_ib_bw_gdr 380
ND H200 v5    conf/nd96isr_h200_v5.conf            check_gpu_bw 48 335; check_nccl_allreduce 431.0 1 16G;
                                                   check_ib_bw_gdr 360
ND A100 v4    conf/nd96asr_v4.conf (A100 40GB)     check_gpu_bw 21 235; check_nccl_allreduce 228.0 1 8G;
                                                   check_ib_bw_gdr 180.0
NDm A100 v4   conf/nd96amsr_a100_v4.conf (80GB)    check_gpu_bw 21 238; check_nccl_allreduce 228.0 1 16G;
                                                   check_ib_bw_gdr 180.0
============  ===================================  ==========================================================

What the numbers mean, from the same commit's customTests:

* ``check_gpu_bw H2D_D2H P2P`` (azure_gpu_bandwidth.nhc): every cell of nvbandwidth's
  host_to_device_memcpy_ce and device_to_host_memcpy_ce (GB/s per GPU) >= the first, every measured cell of
  device_to_device_memcpy_read_ce (GB/s per GPU pair, N/A skipped) >= the second;
* ``check_nccl_allreduce BW REPEATS SIZE`` (azure_nccl_allreduce.nhc): all_reduce_perf ``-b SIZE -e SIZE -f 2
  -g 1 -c 1``, one rank per GPU, its ``# Avg bus bandwidth`` (GB/s) >= BW, and no line with "FAILED";
* ``check_ib_bw_gdr BW`` (azure_ib_write_bw_gdr.nhc): per HCA, an ib_write_bw loopback ``-s 8388608 -F
  --report_gbits --perform_warm_up --use_cuda=<i>`` whose BW average (Gb/s) >= BW.

A row is chosen by the GPUs' PCI device id (sysfs, as the PCI bus reports it; pci.ids names) or else their
``Model:`` (``/proc/driver/nvidia/gpus/<pci>/information``) and their count. Topology decides what applies:
a row's all-reduce and P2P figures are for its full GPU count over NVLink, so a node whose count differs
matches no row (the config's ``validate.sku`` names the row it must be, and then a different count fails);
all_reduce_perf runs over every GPU found; the GDR loopback runs once per active InfiniBand port, each with the
GPU of the same index (as Azure pairs them); an HCA without a row's figure gets 90% of its measured port
rate (Azure's A100 rows: 180 of HDR's 200 Gb/s; the H100 row is 95% of NDR's 400). Config overrides win.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.config import ValidateThresholds
from gna_sdk import HostPaths

AZURE = "Azure/azurehpc-health-checks@df20d06801dbe8461e7e5661223829109622143c"
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA / 3D controller (pci_ids.h PCI_CLASS_DISPLAY_*)
NVSWITCH_CLASS = "0x0680"  # "Bridge: other" (an HGX baseboard's NVSwitches as the PCI bus shows them)
MAX_DEVICES = 4096
MAX_HCAS = 64
RATE_FRACTION_WITHOUT_ROW = 0.9
_MODEL = re.compile(r"^Model:\s*(.{1,120}?)\s*$", re.MULTILINE)
_MINOR = re.compile(r"^Device Minor:\s*(\d{1,4})\s*$", re.MULTILINE)
_RATE = re.compile(r"^\s*(\d{1,5}(?:\.\d{1,3})?)\s*Gb/sec")


@dataclass(frozen=True)
class SkuRow:
    key: str  # what validate.sku names
    name: str
    device_ids: tuple[str, ...]  # PCI device ids of its GPU
    models: tuple[str, ...]  # /proc/driver/nvidia "Model:" spellings
    gpus: int
    allreduce_busbw: float  # GB/s
    allreduce_bytes: str  # all_reduce_perf -b/-e
    h2d: float  # GB/s per GPU (also D2H)
    p2p: float  # GB/s per pair
    ib_gdr: float  # Gb/s per HCA
    source: str


SKUS: tuple[SkuRow, ...] = (
    SkuRow("nd_h100_v5", "ND H100 v5", ("0x2330",), ("NVIDIA H100 80GB HBM3",), 8, 460.0, "16G", 48.0, 335.0,
           380.0, f"{AZURE} conf/nd96isr_h100_v5.conf"),
    SkuRow("nd_h200_v5", "ND H200 v5", ("0x2335",), ("NVIDIA H200",), 8, 431.0, "16G", 48.0, 335.0, 360.0,
           f"{AZURE} conf/nd96isr_h200_v5.conf"),
    SkuRow("nd_a100_v4", "ND A100 v4", ("0x20b0",), ("NVIDIA A100-SXM4-40GB",), 8, 228.0, "8G", 21.0, 235.0,
           180.0, f"{AZURE} conf/nd96asr_v4.conf"),
    SkuRow("ndm_a100_v4", "NDm A100 v4", ("0x20b2",), ("NVIDIA A100-SXM4-80GB",), 8, 228.0, "16G", 21.0, 238.0,
           180.0, f"{AZURE} conf/nd96amsr_a100_v4.conf"),
)
SKU_KEYS = tuple(r.key for r in SKUS)


@dataclass(frozen=True)
class Gpu:
    pci: str
    device_id: str
    model: str
    minor: int | None


@dataclass(frozen=True)
class IbPort:
    hca: str
    port: int
    rate_gbits: float | None
    active: bool


@dataclass
class Topology:
    """What the host tree says about the node's GPUs, NVSwitches and InfiniBand ports."""

    gpus: list[Gpu] = field(default_factory=list)
    nvswitches: int = 0
    ib_ports: list[IbPort] = field(default_factory=list)

    @property
    def model(self) -> str:
        models = sorted({g.model or g.device_id for g in self.gpus})
        return " + ".join(models)[:256]


def _read(host: HostPaths, path: str, limit: int = 4096) -> str:
    return (host.read_text(path, limit) or "").strip()


def read_topology(host: HostPaths) -> Topology:
    topo = Topology()
    try:
        devices = sorted(p.name for p in host.path("/sys/bus/pci/devices").iterdir())[:MAX_DEVICES]
    except OSError:
        devices = []
    for bdf in devices:
        base = f"/sys/bus/pci/devices/{bdf}"
        if _read(host, f"{base}/vendor", 64) != NVIDIA_VENDOR:
            continue
        klass = _read(host, f"{base}/class", 64)
        if klass.startswith(NVSWITCH_CLASS):
            topo.nvswitches += 1
        if not klass.startswith(GPU_CLASSES):
            continue
        info = _read(host, f"/proc/driver/nvidia/gpus/{bdf}/information")
        model = m.group(1) if (m := _MODEL.search(info)) else ""
        minor = int(m.group(1)) if (m := _MINOR.search(info)) else None
        topo.gpus.append(Gpu(pci=bdf, device_id=_read(host, f"{base}/device", 64)[:16], model=model, minor=minor))
    try:
        hcas = sorted(p.name for p in host.path("/sys/class/infiniband").iterdir())[:MAX_HCAS]
    except OSError:
        hcas = []
    for hca in hcas:
        try:
            ports = sorted(int(p.name) for p in host.path(f"/sys/class/infiniband/{hca}/ports").iterdir()
                           if p.name.isdigit())[:8]
        except OSError:
            continue
        for port in ports:
            base = f"/sys/class/infiniband/{hca}/ports/{port}"
            if _read(host, f"{base}/link_layer", 64) != "InfiniBand":
                continue  # RoCE/Ethernet: not the compute fabric Azure's GDR figure is for
            rate = float(m.group(1)) if (m := _RATE.match(_read(host, f"{base}/rate", 128))) else None
            topo.ib_ports.append(IbPort(hca=hca, port=port, rate_gbits=rate,
                                        active=_read(host, f"{base}/state", 64).endswith("ACTIVE")))
    return topo


def row_for_gpu(gpu: Gpu) -> SkuRow | None:
    for row in SKUS:
        if gpu.device_id.lower() in row.device_ids:
            return row
    for row in SKUS:
        if gpu.model in row.models:
            return row
    return None


@dataclass
class Limits:
    """The figures each check is held to (None: none applies; the check then judges correctness only), each
    with where it came from."""

    sku: SkuRow | None
    allreduce_busbw: float | None = None
    allreduce_bytes: str = "1G"
    h2d: float | None = None
    d2h: float | None = None
    p2p: float | None = None
    ib_gdr: dict[str, float] = field(default_factory=dict)  # "mlx5_0:1" -> Gb/s
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    mismatch: str = ""  # a configured SKU the node does not match: why (a failed check)


def limits_for(topo: Topology, configured_sku: str, overrides: ValidateThresholds) -> Limits:
    rows = {row_for_gpu(g) for g in topo.gpus}
    detected = next(iter(rows)) if len(rows) == 1 else None
    if configured_sku != "auto":
        sku: SkuRow | None = next(r for r in SKUS if r.key == configured_sku)
        if detected is not sku or len(topo.gpus) != sku.gpus:  # type: ignore[union-attr]
            assert sku is not None
            seen = f"{len(topo.gpus)} x {topo.model or 'no GPU'}"
            lim = Limits(sku=sku, mismatch=f"validate.sku is {sku.key} ({sku.gpus} x {sku.models[0]}), the node "
                                           f"has {seen}")
        else:
            lim = Limits(sku=sku)
    elif detected is not None and len(topo.gpus) == detected.gpus:
        sku = detected
        lim = Limits(sku=sku)
    else:
        sku = None
        lim = Limits(sku=None)
        if detected is not None:
            lim.notes.append(f"{len(topo.gpus)} x {topo.model}: {detected.name} has {detected.gpus}; its figures "
                             "are for that count, so none applies (set validate.sku to require it)")
        elif topo.gpus:
            lim.notes.append(f"no table row for {topo.model}: figures are reported, not judged "
                             "(validate.thresholds sets them)")
    if sku is not None:
        lim.allreduce_busbw, lim.allreduce_bytes = sku.allreduce_busbw, sku.allreduce_bytes
        lim.h2d = lim.d2h = sku.h2d
        lim.p2p = sku.p2p
        for key in ("allreduce", "h2d", "d2h", "p2p", "ib_gdr"):
            lim.sources[key] = sku.source
    for port in topo.ib_ports:
        name = f"{port.hca}:{port.port}"
        if sku is not None:
            lim.ib_gdr[name] = sku.ib_gdr
        elif port.rate_gbits:
            lim.ib_gdr[name] = round(port.rate_gbits * RATE_FRACTION_WITHOUT_ROW, 1)
            lim.sources["ib_gdr"] = (f"{RATE_FRACTION_WITHOUT_ROW:.0%} of the port's rate (sysfs ports/<n>/rate), "
                                     f"as {AZURE} conf/nd96asr_v4.conf: 180 of 200 Gb/s")
    o = overrides
    for key, value in (("allreduce_busbw", o.nccl_allreduce_busbw), ("h2d", o.h2d), ("d2h", o.d2h), ("p2p", o.p2p)):
        if value is not None:
            setattr(lim, key, value)
            lim.sources["allreduce" if key == "allreduce_busbw" else key] = "config validate.thresholds"
    if o.nccl_allreduce_bytes:
        lim.allreduce_bytes = o.nccl_allreduce_bytes
    if o.ib_gdr is not None:
        lim.ib_gdr = {name: o.ib_gdr for name in lim.ib_gdr} or {
            f"{p.hca}:{p.port}": o.ib_gdr for p in topo.ib_ports}
        lim.sources["ib_gdr"] = "config validate.thresholds"
    return lim
