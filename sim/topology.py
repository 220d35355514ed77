"""Simulated PCIe trees laid out like real sysfs, for the topology collector and ``gpu-node-agent topo``.

What the kernel shows and these builders reproduce (Documentation/ABI/testing/sysfs-bus-pci,
drivers/pci/pci-sysfs.c, drivers/pci/probe.c ``pci_speed_string``):

- ``/sys/devices/pci<domain>:<bus>/`` is one host bridge (root complex); every PCI function is a
  directory under its parent bridge's directory, so the path spells the route from the CPU:
  ``pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:1b:00.0`` is root port, switch upstream
  port, switch downstream port, GPU.
- ``/sys/bus/pci/devices/<bdf>`` is a relative symlink into that tree
  (``../../../devices/pci0000:15/...``).
- each function has ``vendor`` / ``device`` / ``subsystem_*`` ("0x%04x"), ``class`` ("0x%06x"),
  ``numa_node`` ("%d", -1 for none), ``local_cpulist`` (a cpulist), and PCIe functions have
  ``current_link_speed`` / ``max_link_speed`` ("32.0 GT/s PCIe"; kernels up to 5.6 printed
  "8 GT/s") and ``current_link_width`` / ``max_link_width`` ("%u").
- ``/sys/class/infiniband/<hca>`` and ``/sys/class/net/<if>`` are symlinks into the PCI function's
  ``infiniband/`` and ``net/`` directories, each with a ``device`` link back to the function.

Two presets with public references for what ``nvidia-smi topo -m`` prints on that hardware:

- :func:`dgx_h100` - 8 H100 SXM, 4 NVSwitches, 8 compute ConnectX-7 (each behind the PCIe switch of
  one GPU), two dual-port storage NICs, 2 sockets. GPU bus ids and NVSwitch placement from NVIDIA's
  Fabric Manager user guide ("The NVIDIA HGX H100 GPU Baseboard": 07-0a:00.0 NVSwitches, GPUs
  1b/43/52/61/9d/c3/d1/df), the GPU-to-NIC pairing and netdev names from the DGX H100 user guide
  ("Network Modules" table: GPU0 ibp24s0 mlx5_0 ... GPU7 ibp220s0 mlx5_11), the resulting matrix from
  public ``nvidia-smi topo -m`` / ``-mp`` output of such a node (kvcache-ai/Mooncake#2039,
  deepseek-ai/DeepEP#397). NVLinks per the Fabric Manager guide: 18 per GPU, four to each of two
  NVSwitches and five to each of the other two.
- :func:`pcie_8gpu` - 8 PCIe GPUs (L40S) behind two levels of PCIe switches per socket, 2 sockets,
  one dual-port NIC on socket 1: the GPU block of vllm-project/vllm#11122 (PIX within a leaf switch,
  PXB across leaves, SYS across sockets) and the NIC placement of warpem/miss-alignment#106.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sim.host import H100_SXM, NVIDIA_VENDOR, SimGPU, SimHost

MELLANOX_VENDOR = "0x15b3"
CX7 = "0x1021"  # ConnectX-7 (MT2910)
CX6DX = "0x101d"  # ConnectX-6 Dx (MT2892)
L40S = "0x26b9"
NVSWITCH_GEN3 = "0x22a3"  # the HGX H100 NVSwitch in the Fabric Manager guide's lspci
BROADCOM = "0x1000"
PEX89 = "0xc030"  # Broadcom PEX89xxx (Gen5)
PLX = "0x10b5"
PEX88 = "0x8796"
INTEL = "0x8086"
ROOT_PORT = "0x352a"

GEN5, GEN4 = "32.0 GT/s PCIe", "16.0 GT/s PCIe"
CLASS_BRIDGE = "0x060400"
CLASS_3D = "0x030200"
CLASS_NVSWITCH = "0x068000"
CLASS_IB = "0x020700"
CLASS_ETH = "0x020000"

DGX_CPUS = ("0-55,112-167", "56-111,168-223")  # 2 x 56-core Xeon 8480C with SMT, as in DeepEP#145
PCIE_BOX_CPUS = ("0-47,96-143", "48-95,144-191")


@dataclass
class PciFunction:
    bdf: str
    real: str  # host path of the function's directory under /sys/devices
    numa: int
    cpulist: str


@dataclass
class TopologyBuilder:
    """Writes PCI functions into a :class:`SimHost` tree exactly where the kernel puts them."""

    host: SimHost
    functions: dict[str, PciFunction] = field(default_factory=dict)
    fm_pid: int = 0

    def host_bridge(self, domain_bus: str, *, numa: int, cpulist: str) -> PciFunction:
        """``domain_bus`` like "0000:15": /sys/devices/pci0000:15 (no attributes of its own that we read)."""
        real = f"/sys/devices/pci{domain_bus}"
        self.host.p(real).mkdir(parents=True, exist_ok=True)
        return PciFunction(f"pci{domain_bus}", real, numa, cpulist)

    def function(self, parent: PciFunction, bdf: str, *, vendor: str, device: str, klass: str,
                 speed: str | None = GEN5, width: int | None = 16, cur_speed: str | None = None,
                 cur_width: int | None = None, subsystem: tuple[str, str] = ("0x0000", "0x0000"),
                 numa: int | None = None) -> PciFunction:
        real = f"{parent.real}/{bdf}"
        numa = parent.numa if numa is None else numa
        attrs = {"vendor": vendor, "device": device, "class": klass, "subsystem_vendor": subsystem[0],
                 "subsystem_device": subsystem[1], "numa_node": str(numa),
                 # an unknown node (-1) makes the kernel print every online CPU (pci_dev_show_local_cpu)
                 "local_cpulist": parent.cpulist}
        if speed is not None and width is not None:
            attrs |= {"max_link_speed": speed, "max_link_width": str(width),
                      "current_link_speed": cur_speed or speed,
                      "current_link_width": str(width if cur_width is None else cur_width)}
        for name, value in attrs.items():
            self.host.write(f"{real}/{name}", f"{value}\n")
        link = self.host.p(f"/sys/bus/pci/devices/{bdf}")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(self.host.p(real), link.parent))
        fn = PciFunction(bdf, real, numa, parent.cpulist)
        self.functions[bdf] = fn
        return fn

    def bridge(self, parent: PciFunction, bdf: str, *, vendor: str = BROADCOM, device: str = PEX89,
               speed: str = GEN5, width: int = 16) -> PciFunction:
        return self.function(parent, bdf, vendor=vendor, device=device, klass=CLASS_BRIDGE, speed=speed,
                             width=width)

    def switch(self, parent: PciFunction, usp: str, dsps: list[str], *, vendor: str = BROADCOM,
               device: str = PEX89, speed: str = GEN5) -> list[PciFunction]:
        """One PCIe switch: its upstream port under ``parent``, its downstream ports under that."""
        up = self.bridge(parent, usp, vendor=vendor, device=device, speed=speed)
        return [self.bridge(up, d, vendor=vendor, device=device, speed=speed) for d in dsps]

    def gpu(self, parent: PciFunction, bdf: str, minor: int, *, device: str = H100_SXM, speed: str = GEN5,
            model: str = "NVIDIA H100 80GB HBM3") -> PciFunction:
        fn = self.function(parent, bdf, vendor=NVIDIA_VENDOR, device=device, klass=CLASS_3D, speed=speed)
        self.host.write(f"/proc/driver/nvidia/gpus/{bdf}/information",
                        f"Model: \t\t {model}\nIRQ:   \t\t 0\nGPU UUID: \t GPU-sim-{minor:04d}\n"
                        f"Bus Location: \t {bdf}\nDevice Minor: \t {minor}\n")
        self.host.add_dev_node(f"nvidia{minor}")
        self.host.gpus.append(SimGPU(bdf, minor, device))
        return fn

    def nvswitch(self, parent: PciFunction, bdf: str) -> PciFunction:
        return self.function(parent, bdf, vendor=NVIDIA_VENDOR, device=NVSWITCH_GEN3, klass=CLASS_NVSWITCH,
                             speed="2.5 GT/s PCIe", width=1)

    def nic(self, parent: PciFunction, bdf: str, hca: str, netdev: str, *, device: str = CX7,
            link_layer: str = "InfiniBand", rate: str = "400 Gb/sec (4X NDR)", speed: str = GEN5) -> PciFunction:
        fn = self.function(parent, bdf, vendor=MELLANOX_VENDOR, device=device,
                           klass=CLASS_IB if link_layer == "InfiniBand" else CLASS_ETH, speed=speed)
        self.class_link("infiniband", hca, fn)
        self.class_link("net", netdev, fn)
        self.host.add_hca(hca, link_layer=link_layer, rate=rate)  # ports and counters, through the class link
        return fn

    def class_link(self, klass: str, name: str, fn: PciFunction) -> None:
        """/sys/class/<klass>/<name> -> ../../devices/.../<bdf>/<klass>/<name>, whose ``device`` -> ../../../<bdf>."""
        target = self.host.p(f"{fn.real}/{klass}/{name}")
        target.mkdir(parents=True, exist_ok=True)
        dev = target / "device"
        if not dev.is_symlink():
            dev.symlink_to(f"../../../{fn.bdf}")  # the kernel's own form
        link = self.host.p(f"/sys/class/{klass}/{name}")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(target, link.parent))

    # -- faults and processes -----------------------------------------------------------
    def set_link(self, bdf: str, *, speed: str | None = None, width: int | None = None) -> None:
        """The link as trained now (``current_link_*``); the capability (``max_link_*``) stays."""
        real = self.functions[bdf].real
        if speed is not None:
            self.host.write(f"{real}/current_link_speed", f"{speed}\n")
        if width is not None:
            self.host.write(f"{real}/current_link_width", f"{width}\n")

    def process(self, pid: int, comm: str, argv: list[str]) -> None:
        """/proc/<pid>/comm holds at most 15 characters (TASK_COMM_LEN 16 with the NUL)."""
        self.host.write(f"/proc/{pid}/comm", f"{comm[:15]}\n")
        self.host.write(f"/proc/{pid}/cmdline", "\0".join(argv) + "\0")

    def start_fabric_manager(self, pid: int = 3121) -> None:
        self.process(pid, "nv-fabricmanager", ["/usr/bin/nv-fabricmanager", "-c",
                                               "/usr/share/nvidia/nvswitch/fabricmanager.cfg"])
        self.fm_pid = pid

    def stop_fabric_manager(self) -> None:
        if self.fm_pid:
            for name in ("comm", "cmdline"):
                self.host.p(f"/proc/{self.fm_pid}/{name}").unlink(missing_ok=True)
            self.host.p(f"/proc/{self.fm_pid}").rmdir()
            self.fm_pid = 0


# -- DGX H100 ---------------------------------------------------------------------------

DGX_GPUS = ("0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
            "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0")
DGX_NVSWITCHES = ("0000:07:00.0", "0000:08:00.0", "0000:09:00.0", "0000:0a:00.0")
# GPU index -> (compute NIC bdf, hca, netdev) per the DGX H100 user guide's network module table
DGX_COMPUTE_NICS = (("0000:18:00.0", "mlx5_0", "ibp24s0"), ("0000:40:00.0", "mlx5_3", "ibp64s0"),
                    ("0000:4f:00.0", "mlx5_4", "ibp79s0"), ("0000:5e:00.0", "mlx5_5", "ibp94s0"),
                    ("0000:9a:00.0", "mlx5_6", "ibp154s0"), ("0000:c0:00.0", "mlx5_9", "ibp192s0"),
                    ("0000:ce:00.0", "mlx5_10", "ibp206s0"), ("0000:dc:00.0", "mlx5_11", "ibp220s0"))
# host bridge, root port, switch upstream port, downstream ports (NIC, GPU[, storage NIC]) per GPU
_DGX_SWITCHES = (("0000:15", "0000:15:01.0", "0000:16:00.0", ("0000:17:00.0", "0000:17:01.0", "0000:17:02.0")),
                 ("0000:3d", "0000:3d:01.0", "0000:3e:00.0", ("0000:3f:00.0", "0000:3f:01.0")),
                 ("0000:4c", "0000:4c:01.0", "0000:4d:00.0", ("0000:4e:00.0", "0000:4e:01.0")),
                 ("0000:5b", "0000:5b:01.0", "0000:5c:00.0", ("0000:5d:00.0", "0000:5d:01.0")),
                 ("0000:97", "0000:97:01.0", "0000:98:00.0", ("0000:99:00.0", "0000:99:01.0", "0000:99:02.0")),
                 ("0000:bd", "0000:bd:01.0", "0000:be:00.0", ("0000:bf:00.0", "0000:bf:01.0")),
                 ("0000:cb", "0000:cb:01.0", "0000:cc:00.0", ("0000:cd:00.0", "0000:cd:01.0")),
                 ("0000:d9", "0000:d9:01.0", "0000:da:00.0", ("0000:db:00.0", "0000:db:01.0")))
# the dual-port storage/in-band NICs: slot 1 behind GPU0's switch, slot 2 behind GPU4's (Mooncake#2039:
# mlx5_1/mlx5_2 PIX to GPU0, mlx5_7/mlx5_8 PIX to GPU4); port 2 is the Ethernet one BasePOD bonds
DGX_STORAGE_NICS = ((0, ("0000:29:00.0", "mlx5_1", "ibp41s0f0"), ("0000:29:00.1", "mlx5_2", "enp41s0f1np1")),
                    (4, ("0000:aa:00.0", "mlx5_7", "ibp170s0f0"), ("0000:aa:00.1", "mlx5_8", "enp170s0f1np1")))
# NVLinks of every GPU, by NVSwitch: four to two of them, five to the other two (Fabric Manager guide)
DGX_LINKS_PER_SWITCH = (4, 4, 5, 5)


def dgx_h100_nvlinks(gpus: tuple[str, ...] = DGX_GPUS) -> dict[str, list[str]]:
    """GPU bus id -> the remote bus id of each active NVLink, as NVML reports them per link."""
    return {g: [sw for sw, n in zip(DGX_NVSWITCHES, DGX_LINKS_PER_SWITCH, strict=True) for _ in range(n)]
            for g in gpus}


def dgx_h100(root: str | Path, *, fabric_manager: bool = True) -> tuple[SimHost, TopologyBuilder]:
    """A DGX H100: healthy (links at Gen5 x16, Fabric Manager running unless ``fabric_manager=False``)."""
    host = SimHost.gpu_node(root, gpus=0)
    b = TopologyBuilder(host)
    b.process(1, "systemd", ["/sbin/init"])
    nvs_hb = b.host_bridge("0000:03", numa=0, cpulist=DGX_CPUS[0])
    nvs_rp = b.bridge(nvs_hb, "0000:03:01.0", vendor=INTEL, device=ROOT_PORT)
    for port, sw in zip(b.switch(nvs_rp, "0000:04:00.0", ["0000:05:00.0", "0000:05:01.0", "0000:05:02.0",
                                                          "0000:05:03.0"]), DGX_NVSWITCHES, strict=True):
        b.nvswitch(port, sw)
    storage = {gpu: nics for gpu, *nics in DGX_STORAGE_NICS}
    for i, (hb, rp, usp, dsps) in enumerate(_DGX_SWITCHES):
        numa = 0 if i < 4 else 1
        bridge = b.host_bridge(hb, numa=numa, cpulist=DGX_CPUS[numa])
        root_port = b.bridge(bridge, rp, vendor=INTEL, device=ROOT_PORT)
        ports = b.switch(root_port, usp, list(dsps))
        nic_bdf, hca, netdev = DGX_COMPUTE_NICS[i]
        b.nic(ports[0], nic_bdf, hca, netdev)
        b.gpu(ports[1], DGX_GPUS[i], i)
        for bdf, hca, netdev in storage.get(i, ()):
            eth = netdev.startswith("enp")
            b.nic(ports[2], bdf, hca, netdev, link_layer="Ethernet" if eth else "InfiniBand",
                  rate="200 Gb/sec (4X HDR)" if eth else "400 Gb/sec (4X NDR)")
    if fabric_manager:
        b.start_fabric_manager()
    return host, b


# -- 8 PCIe GPUs behind PCIe switches -----------------------------------------------------

PCIE_GPUS = ("0000:1c:00.0", "0000:1d:00.0", "0000:22:00.0", "0000:23:00.0",
             "0000:9c:00.0", "0000:9d:00.0", "0000:a2:00.0", "0000:a3:00.0")
PCIE_NICS = (("0000:ca:00.0", "mlx5_0", "ens1f0np0"), ("0000:ca:00.1", "mlx5_1", "ens1f1np1"))
# per socket: host bridge, root port, top switch (USP, DSPs), two leaf switches (USP, DSPs)
_PCIE_TREES = (("0000:16", "0000:16:01.0", ("0000:17:00.0", ["0000:18:00.0", "0000:18:01.0"]),
                (("0000:19:00.0", ["0000:1a:00.0", "0000:1a:01.0"]),
                 ("0000:1f:00.0", ["0000:20:00.0", "0000:20:01.0"]))),
               ("0000:97", "0000:97:01.0", ("0000:98:00.0", ["0000:99:00.0", "0000:99:01.0"]),
                (("0000:9a:00.0", ["0000:9b:00.0", "0000:9b:01.0"]),
                 ("0000:a0:00.0", ["0000:a1:00.0", "0000:a1:01.0"]))))


def pcie_8gpu(root: str | Path) -> tuple[SimHost, TopologyBuilder]:
    """8x L40S (PCIe Gen4 x16) behind two levels of PCIe switches per socket, a dual-port ConnectX-6 Dx on
    socket 1's own root port. No NVLink, no NVSwitch."""
    host = SimHost.gpu_node(root, gpus=0)
    b = TopologyBuilder(host)
    b.process(1, "systemd", ["/sbin/init"])
    for sock, (hb, rp, (top, top_dsps), leaves) in enumerate(_PCIE_TREES):
        bridge = b.host_bridge(hb, numa=sock, cpulist=PCIE_BOX_CPUS[sock])
        root_port = b.bridge(bridge, rp, vendor=INTEL, device=ROOT_PORT, speed=GEN4)
        top_ports = b.switch(root_port, top, top_dsps, vendor=PLX, device=PEX88, speed=GEN4)
        for leaf, ((usp, dsps), up) in enumerate(zip(leaves, top_ports, strict=True)):
            for j, port in enumerate(b.switch(up, usp, dsps, vendor=PLX, device=PEX88, speed=GEN4)):
                g = sock * 4 + leaf * 2 + j
                b.gpu(port, PCIE_GPUS[g], g, device=L40S, speed=GEN4, model="NVIDIA L40S")
    nic_hb = b.host_bridge("0000:c9", numa=1, cpulist=PCIE_BOX_CPUS[1])
    nic_rp = b.bridge(nic_hb, "0000:c9:01.0", vendor=INTEL, device=ROOT_PORT, speed=GEN4)
    for bdf, hca, netdev in PCIE_NICS:
        b.nic(nic_rp, bdf, hca, netdev, device=CX6DX, link_layer="Ethernet", rate="100 Gb/sec (4X EDR)",
              speed=GEN4)
    return host, b
