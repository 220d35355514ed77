"""Builder for simulated host roots: a directory laid out like a GPU node's /sys, /proc and /dev.

Tests, the demo and benchmarks share it; collector issues extend it with their own parts.
Layout follows the kernel (drivers/pci/pci-sysfs.c, drivers/pci/probe.c, Documentation/ABI/testing/
sysfs-bus-pci and sysfs-class-infiniband; node_exporter's sysfs fixtures):

- ``/sys/devices/pci<domain>:<bus>`` is one host bridge and every PCI function is a directory under its
  parent bridge's, so the path spells the route from the CPU (root port, switch upstream port, switch
  downstream port, device); ``/sys/bus/pci/devices/<bdf>`` is a relative symlink into that tree
  (``../../../devices/pci0000:14/0000:14:01.0/...``). Each function has ``vendor``, ``device``,
  ``class``, ``numa_node`` ("%d", -1 for none), ``local_cpulist`` and its PCIe link attributes.
- ``/sys/class/infiniband/<hca>`` and ``/sys/class/net/<if>`` are relative symlinks into the PCI
  function's ``infiniband/<hca>`` and ``net/<if>`` directories, each holding ``device`` ->
  ``../../../<bdf>``; port files and counters live there.
- ``/sys/module/<name>/initstate``, ``/proc/modules``, ``/proc/devices``, ``/dev`` nodes as regular files.

:meth:`SimHost.gpu_node` lays an HGX H100 baseboard out this way (see there); sim/topology.py builds
other trees (a DGX H100 with its published bus ids, a PCIe-switch box) with the same conventions.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

NVIDIA_VENDOR = "0x10de"
H100_SXM = "0x2330"
H200_SXM = "0x2335"
NVIDIA_MAJOR = 195
IB_COUNTERS = ("VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
               "local_link_integrity_errors", "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors",
               "port_rcv_packets", "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
               "port_xmit_constraint_errors", "port_xmit_data", "port_xmit_discards", "port_xmit_packets",
               "port_xmit_wait", "symbol_error", "unicast_rcv_packets", "unicast_xmit_packets",
               "multicast_rcv_packets", "multicast_xmit_packets")
IB_HW_COUNTERS = ("duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err", "out_of_buffer",
                  "out_of_sequence", "packet_seq_err", "req_cqe_error", "req_cqe_flush_error",
                  "req_remote_access_errors", "req_remote_invalid_request", "resp_cqe_error",
                  "resp_cqe_flush_error", "resp_local_length_error", "resp_remote_access_errors",
                  "rnr_nak_retry_err", "rx_atomic_requests", "rx_read_requests", "rx_write_requests",
                  "np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored",
                  "roce_adp_retrans", "roce_slow_restart")
UVM_MAJOR = 511

# PCI ids and attribute values of the simulated tree (pci.ids; the kernel's "%#06x" / "%#08x" spelling)
INTEL_VENDOR, INTEL_ROOT_PORT = "0x8086", "0x352a"  # Sapphire Rapids PCIe root port
BROADCOM_VENDOR, PEX89 = "0x1000", "0xc030"  # Broadcom PEX89xxx Gen5 switch (HGX H100 baseboard)
MELLANOX_VENDOR, CX7 = "0x15b3", "0x1021"  # ConnectX-7
NVSWITCH_GEN3 = "0x22a3"
CLASS_BRIDGE, CLASS_HOST_BRIDGE, CLASS_3D = "0x060400", "0x060000", "0x030200"
CLASS_NVSWITCH, CLASS_IB, CLASS_ETH = "0x068000", "0x020700", "0x020000"
GEN5 = "32.0 GT/s PCIe"
SOCKET_CPUS = ("0-55,112-167", "56-111,168-223")  # 2 x 56-core Xeon 8480C with SMT, per NUMA node
ALL_CPUS = "0-223"  # what local_cpulist shows for numa_node -1 (every online CPU)
# gpu_node's GPU buses in minor order (an HGX H100 8-GPU server's, as nvidia-smi lists them): 0x00-0x7f on
# socket 0, 0x80-0xff on socket 1. Each GPU's PCIe switch takes the four buses below its own (host
# bridge, switch, downstream ports, NIC) and one above it per extra NIC: the 16 never overlap.
GPU_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db", "20", "31", "42", "64", "a1", "b2", "c2", "e2")
NVSWITCH_BUSES = ("05", "06", "07", "08")  # hgx_node's NVSwitches, behind one switch on host bridge 0x02
STORAGE_NIC_BUS = "0d"  # the storage/management NIC: its own root port on socket 0's host bridge 0x0c


@dataclass
class SimGPU:
    bus_id: str  # 0000:18:00.0
    minor: int
    device_id: str = H100_SXM


@dataclass
class SimHost:
    root: Path
    gpus: list[SimGPU] = field(default_factory=list)
    modules: dict[str, str] = field(default_factory=dict)  # name -> "live"/"coming"/"going"
    _kmsg_seq: int = 0
    mounts: list[tuple[str, str, str, str]] = field(default_factory=list)
    _uptime: float = 3600.0

    def p(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def write(self, host_path: str, text: str) -> Path:
        path = self.p(host_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.sim")
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic, like sysfs: a reader never sees half a value
        return path

    # -- the PCI tree -----------------------------------------------------------------------
    def add_host_bridge(self, domain_bus: str) -> str:
        """``domain_bus`` like "0000:14": the root complex /sys/devices/pci0000:14 (its /sys path)."""
        real = f"/sys/devices/pci{domain_bus}"
        self.p(real).mkdir(parents=True, exist_ok=True)
        return real

    def add_pci_function(self, parent: str, bdf: str, *, vendor: str, device: str, klass: str, numa: int = -1,
                         speed: str | None = GEN5, width: int | None = 16) -> str:
        """One PCI function where the kernel puts it: a directory under ``parent`` (a host bridge's or a
        bridge function's /sys/devices path) with its attributes, and /sys/bus/pci/devices/<bdf> a relative
        symlink to it. Returns its /sys/devices path."""
        real = f"{parent}/{bdf}"
        attrs = {"vendor": vendor, "device": device, "class": klass, "subsystem_vendor": "0x0000",
                 "subsystem_device": "0x0000", "numa_node": str(numa),
                 "local_cpulist": SOCKET_CPUS[numa] if 0 <= numa < len(SOCKET_CPUS) else ALL_CPUS}
        if speed is not None and width is not None:
            attrs |= {"current_link_speed": speed, "current_link_width": str(width), "max_link_speed": speed,
                      "max_link_width": str(width)}
        for name, value in attrs.items():
            self.write(f"{real}/{name}", f"{value}\n")
        link = self.p(f"/sys/bus/pci/devices/{bdf}")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(self.p(real), link.parent))
        return real

    def add_pcie_switch(self, parent: str, usp: str, dsps: list[str], *, numa: int = -1) -> list[str]:
        """A PCIe switch: its upstream port under ``parent``, its downstream ports under that (their paths)."""
        up = self.add_pci_function(parent, usp, vendor=BROADCOM_VENDOR, device=PEX89, klass=CLASS_BRIDGE, numa=numa)
        return [self.add_pci_function(up, d, vendor=BROADCOM_VENDOR, device=PEX89, klass=CLASS_BRIDGE, numa=numa)
                for d in dsps]

    def bind_driver(self, function: str, driver: str) -> None:
        """<function>/driver -> /sys/bus/pci/drivers/<driver> (relative, as the driver core links it)."""
        drv = self.p(f"/sys/bus/pci/drivers/{driver}")
        drv.mkdir(parents=True, exist_ok=True)
        link = self.p(f"{function}/driver")
        if link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(drv, link.parent))

    def class_link(self, klass: str, name: str, function: str) -> None:
        """/sys/class/<klass>/<name> -> ../../devices/.../<bdf>/<klass>/<name>, whose ``device`` is
        ../../../<bdf> (the kernel's own relative forms)."""
        target = self.p(f"{function}/{klass}/{name}")
        target.mkdir(parents=True, exist_ok=True)
        dev = target / "device"
        if not dev.is_symlink():
            dev.symlink_to(f"../../../{function.rsplit('/', 1)[-1]}")
        link = self.p(f"/sys/class/{klass}/{name}")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(target, link.parent))

    # -- GPUs ------------------------------------------------------------------------
    def add_gpu(self, bus_id: str, minor: int, device_id: str = H100_SXM, *, dev_node: bool = True,
                parent: str | None = None, numa: int = -1) -> SimGPU:
        """A GPU under ``parent`` (a /sys/devices path: a switch's downstream port), or without one straight
        under its own host bridge pci<domain>:<bus> (a root-complex endpoint: SYS to everything)."""
        gpu = SimGPU(bus_id, minor, device_id)
        if parent is None:
            parent = self.add_host_bridge(":".join(bus_id.split(":")[:2]))
        self.add_pci_function(parent, bus_id, vendor=NVIDIA_VENDOR, device=device_id, klass=CLASS_3D, numa=numa)
        self.write(f"/proc/driver/nvidia/gpus/{bus_id}/information",
                   f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t GPU-sim-{minor:04d}\n"
                   f"Bus Location: \t {bus_id}\nDevice Minor: \t {minor}\n")
        self.gpus.append(gpu)
        if dev_node:
            self.add_dev_node(f"nvidia{minor}")
        return gpu

    def add_other_pci(self, bus_id: str, vendor: str, klass: str, *, parent: str | None = None,
                      device: str = "0x0000", numa: int = -1) -> str:
        if parent is None:
            parent = self.add_host_bridge(":".join(bus_id.split(":")[:2]))
        return self.add_pci_function(parent, bus_id, vendor=vendor, device=device, klass=klass, numa=numa,
                                     speed=None, width=None)

    def add_dev_node(self, name: str) -> Path:
        # A regular file stands in for the character device (mknod needs CAP_MKNOD).
        path = self.p(f"/dev/{name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        return path

    def remove_dev_node(self, name: str) -> None:
        self.p(f"/dev/{name}").unlink(missing_ok=True)

    # -- kernel modules --------------------------------------------------------------
    def load_module(self, name: str, state: str = "live", version: str | None = None) -> None:
        self.write(f"/sys/module/{name}/initstate", f"{state}\n")
        if version:
            self.write(f"/sys/module/{name}/version", f"{version}\n")
        self.modules[name] = state
        self._write_proc_modules()

    def unload_module(self, name: str) -> None:
        mod = self.p(f"/sys/module/{name}")
        for path in sorted(mod.rglob("*"), reverse=True):
            path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
        if mod.exists():
            mod.rmdir()
        self.modules.pop(name, None)
        self._write_proc_modules()

    def _write_proc_modules(self) -> None:
        states = {"live": "Live", "coming": "Loading", "going": "Unloading"}
        lines = [f"{name} 16384 0 - {states.get(st, 'Live')} 0x0000000000000000 (OE)"
                 for name, st in sorted(self.modules.items())]
        self.write("/proc/modules", "".join(f"{line}\n" for line in lines))

    # -- InfiniBand / RoCE (collector issues extend the counters) ---------------------
    def add_hca(self, name: str, ports: int = 1, *, link_layer: str = "InfiniBand",
                rate: str = "400 Gb/sec (4X NDR)", state: str = "4: ACTIVE", phys_state: str = "5: LinkUp") -> None:
        base = f"/sys/class/infiniband/{name}"
        self.write(f"{base}/node_type", "1: CA\n")
        self.write(f"{base}/fw_ver", "28.39.1002\n")
        self.write(f"{base}/board_id", "MT_0000000838\n")  # ConnectX-7
        self.write(f"{base}/hca_type", "MT4129\n")
        self.write(f"{base}/node_guid", f"946d:ae03:00{len(name):02x}:{abs(hash(name)) % 65536:04x}\n")
        for port in range(1, ports + 1):
            self.set_port(name, port, state=state, phys_state=phys_state, rate=rate)
            self.write(f"{base}/ports/{port}/link_layer", f"{link_layer}\n")
            for counter in IB_COUNTERS:
                self.set_counter(name, port, counter, 0)
            for counter in IB_HW_COUNTERS:
                self.set_counter(name, port, counter, 0, hw=True)

    def add_nic(self, parent: str, bdf: str, hca: str, *, numa: int = -1, link_layer: str = "InfiniBand",
                rate: str = "400 Gb/sec (4X NDR)") -> str:
        """A ConnectX-7 under ``parent``: its PCI function, /sys/class/infiniband/<hca> and its netdev
        (ibp<bus>s0 for IPoIB, enp<bus>s0np0 for Ethernet, as udev names them) linked into it, then
        :meth:`add_hca`'s port files through the class link."""
        real = self.add_pci_function(parent, bdf, vendor=MELLANOX_VENDOR, device=CX7, numa=numa,
                                     klass=CLASS_IB if link_layer == "InfiniBand" else CLASS_ETH)
        bus = int(bdf.split(":")[1], 16)
        self.bind_driver(real, "mlx5_core")
        netdev = f"ibp{bus}s0" if link_layer == "InfiniBand" else f"enp{bus}s0np0"
        self.class_link("infiniband", hca, real)
        self.class_link("net", netdev, real)
        self.write(f"/sys/class/net/{netdev}/operstate", "up\n")
        self.add_hca(hca, link_layer=link_layer, rate=rate)
        return real

    def set_port(self, hca: str, port: int = 1, *, state: str | None = None, phys_state: str | None = None,
                 rate: str | None = None) -> None:
        p = f"/sys/class/infiniband/{hca}/ports/{port}"
        for name, value in (("state", state), ("phys_state", phys_state), ("rate", rate)):
            if value is not None:
                self.write(f"{p}/{name}", f"{value}\n")

    def set_counter(self, hca: str, port: int, name: str, value: int | str, *, hw: bool = False) -> None:
        sub = "hw_counters" if hw else "counters"
        self.write(f"/sys/class/infiniband/{hca}/ports/{port}/{sub}/{name}", f"{value}\n")

    def add_counter(self, hca: str, port: int, name: str, delta: int, *, hw: bool = False) -> int:
        sub = "hw_counters" if hw else "counters"
        path = self.p(f"/sys/class/infiniband/{hca}/ports/{port}/{sub}/{name}")
        value = int(path.read_text().strip() or 0) + delta
        self.set_counter(hca, port, name, value, hw=hw)
        return value

    def remove_hca(self, name: str) -> None:
        """The RDMA device goes (driver unbound): its class entry and what it points at; the PCI function stays."""
        import shutil

        link = self.p(f"/sys/class/infiniband/{name}")
        if link.is_symlink():
            target = link.resolve()
            link.unlink()
            shutil.rmtree(target)
        else:
            shutil.rmtree(link)

    def set_roce_ecn(self, netdev: str, *, np: dict[int, str] | None = None, rp: dict[int, str] | None = None,
                     enabled: bool = True) -> None:
        """MLNX_OFED's per-priority ECN enables of a RoCE netdev (mlx5_core en_sysfs.c mlx5e_fill_attributes:
        ``ecn/roce_np|roce_rp/enable/0..7``, each "%d\\n"): every priority ``enabled``, then ``np``/``rp``
        override single priorities with the file's raw text ("0", "1", "" for a failed firmware query)."""
        for proto, over in (("roce_np", np or {}), ("roce_rp", rp or {})):
            for prio in range(8):
                text = over.get(prio, "1" if enabled else "0")
                self.write(f"/sys/class/net/{netdev}/ecn/{proto}/enable/{prio}", f"{text}\n" if text else "")

    def set_ethtool_stats(self, netdev: str, stats: dict[str, int]) -> None:
        """What ``ethtool -S <netdev>`` would print, at the test seam collectors/formats/roce_qos.py
        FIXTURE_DIR (``/.sim/ethtool-S/<netdev>``): no real host has this path, it stands for SIOCETHTOOL."""
        body = "".join(f"     {k}: {v}\n" for k, v in sorted(stats.items()))
        self.write(f"/.sim/ethtool-S/{netdev}", f"NIC statistics:\n{body}")

    def set_dcb(self, netdev: str, *, pfc: set[int] | None = None, pfc_cap: int = 8,
                dscp2prio: dict[int, int] | None = None, dcbx: int | None = 0x09, seq: int = 0) -> None:
        """The kernel's reply to RTM_GETDCB / DCB_CMD_IEEE_GET for ``netdev`` at the test seam
        collectors/formats/dcb_netlink.py FIXTURE_DIR (``/.sim/dcb-ieee/<netdev>``, hex). Laid out as net/dcb/
        dcbnl.c ``dcbnl_ieee_fill`` builds it (include/uapi/linux/dcbnl.h): DCB_ATTR_IFNAME, a DCB_ATTR_IEEE nest
        with an ETS object (mlx5e has ``ieee_getets``), DCB_ATTR_IEEE_PFC (``struct ieee_pfc``) unless ``pfc`` is
        None (a driver without ``ieee_getpfc``), the APP table (one DSCP entry per ``dscp2prio`` key, as mlx5e
        publishes in DSCP trust; none in PCP trust), then DCB_ATTR_DCBX (mlx5e: DCB_CAP_DCBX_HOST |
        DCB_CAP_DCBX_VER_IEEE = 0x09)."""

        def nla(kind: int, payload: bytes, nested: bool = False) -> bytes:
            size = 4 + len(payload)
            return struct.pack("=HH", size, kind | (0x8000 if nested else 0)) + payload + b"\0" * (-size % 4)

        ieee = nla(1, bytes(59))  # DCB_ATTR_IEEE_ETS: struct ieee_ets, 3 + 7 * 8 bytes, zeros
        if pfc is not None:
            en = sum(1 << p for p in pfc)
            ieee += nla(2, struct.pack("=BBBxHxx8Q8Q", pfc_cap, en, 0, 0, *([0] * 16)))  # DCB_ATTR_IEEE_PFC
        apps = b"".join(nla(1, struct.pack("=BBH", 5, prio, dscp))  # DCB_ATTR_IEEE_APP, IEEE_8021QAZ_APP_SEL_DSCP
                        for dscp, prio in sorted((dscp2prio or {}).items()))
        ieee += nla(3, apps, nested=True)  # DCB_ATTR_IEEE_APP_TABLE
        body = struct.pack("=BBH", 0, 21, 0)  # struct dcbmsg: AF_UNSPEC, DCB_CMD_IEEE_GET
        body += nla(1, netdev.encode() + b"\0")  # DCB_ATTR_IFNAME
        body += nla(13, ieee, nested=True)  # DCB_ATTR_IEEE
        if dcbx is not None:
            body += nla(14, bytes([dcbx]))  # DCB_ATTR_DCBX
        msg = struct.pack("=IHHII", 16 + len(body), 78, 0, seq, 0) + body  # nlmsghdr, RTM_GETDCB
        self.write(f"/.sim/dcb-ieee/{netdev}", msg.hex() + "\n")

    def add_gdr_provider(self) -> None:
        """What nvidia_peermem (or nv_peer_mem) exposes when GPUDirect RDMA is available."""
        self.write("/sys/kernel/mm/memory_peers/nv_mem/version", "1.3\n")

    # -- kernel log ------------------------------------------------------------------
    def kmsg(self, message: str, *, prio: int = 4, seq: int | None = None, usec: int | None = None) -> None:
        """Append one record in /dev/kmsg's text form (a regular file stands in for the device)."""
        path = self.p("/dev/kmsg")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._kmsg_seq = (self._kmsg_seq + 1) if seq is None else seq
        # records are "now": at the simulated uptime, so a first start's look-back includes them
        usec = int(self._uptime * 1e6) + self._kmsg_seq if usec is None else usec
        with open(path, "ab") as fh:
            fh.write(f"{prio},{self._kmsg_seq},{usec},-;{message}\n".encode())

    def set_boot(self, boot_id: str, uptime: float = 3600.0) -> None:
        self._uptime = uptime
        self.write("/proc/sys/kernel/random/boot_id", f"{boot_id}\n")
        self.write("/proc/uptime", f"{uptime:.2f} {uptime * 10:.2f}\n")
        # proc(5): "btime" is the boot's wall time; the kernel log's uptime stamps are counted from it
        self.write("/proc/stat", f"cpu  0 0 0 0 0 0 0 0 0 0\nbtime {int(time.time() - uptime)}\n")

    # -- mounts and JuiceFS -------------------------------------------------------------
    def add_mount(self, source: str, mountpoint: str, fstype: str, options: str = "rw,relatime") -> None:
        self.mounts.append((source, mountpoint, fstype, options))
        self.write("/proc/mounts", "".join(
            f"{src.replace(' ', chr(92) + '040')} {mp.replace(' ', chr(92) + '040')} {fs} {opt} 0 0\n"
            for src, mp, fs, opt in self.mounts))

    def add_juicefs(self, mountpoint: str, cache_dir: str, *, volume: str = "myjfs", cache_size: int = 10 << 30,
                    version: str = "1.2.1+2024-08-30.cc3b8f2", prefetch: int = 1, free_space: float = 0.1,
                    uuid: str = "9f5e8c2a-0b1d-4c6e-8f7a-3d2b1c0e9a88", blocks: int = 10) -> None:
        import json

        self.add_mount(f"JuiceFS:{volume}", mountpoint, "fuse.juicefs",
                       "rw,relatime,user_id=0,group_id=0,default_permissions,allow_other")
        self.write(f"{mountpoint}/.config", json.dumps({
            "Version": version, "Format": {"Name": volume, "UUID": uuid},
            "Chunk": {"CacheDir": f"{cache_dir}/{uuid}", "CacheSize": cache_size, "FreeSpace": free_space,
                      "Prefetch": prefetch, "BufferSize": 300 << 20, "AutoCreate": True}}))
        raw = self.p(f"{cache_dir}/{uuid}/raw/chunks/0/0")
        raw.mkdir(parents=True, exist_ok=True)
        for i in range(blocks):
            (raw / f"{i}_0_4194304").write_bytes(b"x" * 64)
        self.juicefs_stats(mountpoint, hits=0, miss=0, blocks=blocks)

    def juicefs_stats(self, mountpoint: str, *, hits: int, miss: int, hit_bytes: int = 0, miss_bytes: int = 0,
                      blocks: int = 10, object_get_bytes: int = 0, fuse_read_bytes: int = 0) -> None:
        self.write(f"{mountpoint}/.stats", (
            f"juicefs_blockcache_blocks {blocks}\njuicefs_blockcache_bytes {blocks * 4194304}\n"
            f"juicefs_blockcache_hits {hits}\njuicefs_blockcache_miss {miss}\n"
            f"juicefs_blockcache_hit_bytes {hit_bytes}\njuicefs_blockcache_miss_bytes {miss_bytes}\n"
            f"juicefs_blockcache_evicts 0\njuicefs_blockcache_drops 0\n"
            # CE's own folding of the method label (juicedata/juicefs pkg/vfs/internal.go, v1.0-v1.3)
            f"juicefs_object_request_data_bytes_GET {object_get_bytes}\n"
            f"juicefs_object_request_data_bytes_PUT 0\n"
            f"juicefs_fuse_read_size_bytes_sum {fuse_read_bytes}\njuicefs_uptime 3600.5\n"))

    # -- presets ---------------------------------------------------------------------
    @classmethod
    def gpu_node(cls, root: str | Path, gpus: int = 8, *, driver_loaded: bool = True, hcas: int = 0,
                 peermem: bool = True, storage_nic: bool = False) -> SimHost:
        """An HGX H100 node: ``gpus`` H100s, driver and device nodes present (healthy); with ``hcas`` NDR
        ConnectX-7s (mlx5_0..), an extra RoCE storage NIC when ``storage_nic``, and nvidia_peermem loaded
        when ``peermem``.

        The PCIe tree is an HGX baseboard's in a 2-socket server: GPU<i> (bus ``GPU_BUSES[i]``, B) sits
        behind its own PCIe switch, host bridge pci0000:<B-4> -> root port <B-4>:01.0 -> switch upstream
        port <B-3>:00.0 -> downstream ports <B-2>:00.0 (mlx5_<i> at <B-1>:00.0) and <B-2>:01.0 (the GPU):
        GPU<i> and mlx5_<i> are PIX, GPUs and NICs on one socket NODE, across sockets SYS (what ``nvidia-smi
        topo -m`` prints on such a node, NVLink aside). HCAs beyond the switches take further downstream
        ports of the switches in turn (<B-2>:0<k+1>.0, NIC at <B+k>:00.0); the storage NIC has its own root
        port on socket 0 (NODE to socket 0's GPUs, SYS to socket 1's)."""
        if gpus > len(GPU_BUSES):
            raise ValueError(f"at most {len(GPU_BUSES)} GPUs")
        host = cls(Path(root))
        host.root.mkdir(parents=True, exist_ok=True)
        host.set_boot("00000000-0000-4000-8000-000000000001")
        host.add_mount("/dev/nvme0n1p2", "/", "ext4")
        host.add_mount("tmpfs", "/dev/shm", "tmpfs", "rw,nosuid,nodev")
        host.add_mount("/dev/nvme1n1", "/var/jfsCache", "xfs")
        host.p("/dev").mkdir(parents=True, exist_ok=True)
        host.p("/dev/kmsg").touch()
        host.add_other_pci("0000:00:00.0", INTEL_VENDOR, CLASS_HOST_BRIDGE, device="0x09a2", numa=0)  # not a GPU
        slots = min(max(gpus, hcas), 8) if hcas else gpus  # GPU switches (a NIC's own where it has no GPU)
        ports: list[tuple[int, int, str]] = []  # per switch: its GPU's bus, NUMA node, upstream port's path
        for i in range(slots):
            b = int(GPU_BUSES[i], 16)
            numa = 0 if b < 0x80 else 1
            hb = host.add_host_bridge(f"0000:{b - 4:02x}")
            rp = host.add_pci_function(hb, f"0000:{b - 4:02x}:01.0", vendor=INTEL_VENDOR, device=INTEL_ROOT_PORT,
                                       klass=CLASS_BRIDGE, numa=numa)
            _, gpu_port = host.add_pcie_switch(rp, f"0000:{b - 3:02x}:00.0",
                                               [f"0000:{b - 2:02x}:00.0", f"0000:{b - 2:02x}:01.0"], numa=numa)
            ports.append((b, numa, f"{rp}/0000:{b - 3:02x}:00.0"))
            if i < gpus:
                host.add_gpu(f"0000:{b:02x}:00.0", i, dev_node=driver_loaded, parent=gpu_port, numa=numa)
        host.write("/proc/devices", f"Character devices:\n  1 mem\n{NVIDIA_MAJOR} nvidia\n"
                   f"{UVM_MAJOR} nvidia-uvm\n\nBlock devices:\n  8 sd\n")
        if driver_loaded:
            for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
                host.add_dev_node(name)
            for mod in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
                host.load_module(mod, version="550.127.05" if mod == "nvidia" else None)
        else:
            host._write_proc_modules()
        for i in range(hcas):
            b, numa, usp = ports[i % slots]
            k = i // slots  # 0: the switch's NIC port; k: its (k+1)th downstream port, bus B+k
            if k == 0:
                parent = f"{usp}/0000:{b - 2:02x}:00.0"
                bdf = f"0000:{b - 1:02x}:00.0"
            else:
                parent = host.add_pci_function(usp, f"0000:{b - 2:02x}:{k + 1:02x}.0", vendor=BROADCOM_VENDOR,
                                               device=PEX89, klass=CLASS_BRIDGE, numa=numa)
                bdf = f"0000:{b + k:02x}:00.0"
            host.add_nic(parent, bdf, f"mlx5_{i}", numa=numa)
        if storage_nic:
            sb = int(STORAGE_NIC_BUS, 16)
            hb = host.add_host_bridge(f"0000:{sb - 1:02x}")
            rp = host.add_pci_function(hb, f"0000:{sb - 1:02x}:01.0", vendor=INTEL_VENDOR, device=INTEL_ROOT_PORT,
                                       klass=CLASS_BRIDGE, numa=0)
            host.add_nic(rp, f"0000:{STORAGE_NIC_BUS}:00.0", f"mlx5_{hcas}", numa=0, link_layer="Ethernet",
                         rate="200 Gb/sec (4X HDR)")
        if hcas and driver_loaded and peermem:
            host.load_module("nvidia_peermem", version="550.127.05")  # /sys/module/nvidia_peermem/version
        return host

    @classmethod
    def hgx_node(cls, root: str | Path) -> SimHost:
        """An HGX H100 node in training: 8 GPUs, 4 NVSwitches, 8 NDR HCAs and a RoCE storage NIC, a
        JuiceFS mount, and one running job (pid 4242) whose log under /var/log/nccl (the nccl_logs
        default glob) is mostly the trainer's own output with a few hundred healthy NCCL INFO lines."""
        host = cls.gpu_node(root, gpus=8, hcas=8, storage_nic=True)
        # the baseboard's NVSwitches ("Bridge: other", NVIDIA) behind one PCIe switch on socket 0
        hb = host.add_host_bridge("0000:02")
        rp = host.add_pci_function(hb, "0000:02:01.0", vendor=INTEL_VENDOR, device=INTEL_ROOT_PORT,
                                   klass=CLASS_BRIDGE, numa=0)
        dsps = host.add_pcie_switch(rp, "0000:03:00.0", [f"0000:04:{d:02x}.0" for d in range(4)], numa=0)
        for port, bus in zip(dsps, NVSWITCH_BUSES, strict=True):
            host.add_pci_function(port, f"0000:{bus}:00.0", vendor=NVIDIA_VENDOR, device=NVSWITCH_GEN3,
                                  klass=CLASS_NVSWITCH, numa=0, speed="2.5 GT/s PCIe", width=1)
        host.add_juicefs("/mnt/jfs", "/var/jfsCache")
        name, pid = "hgx-0001", 4242
        host.write("/proc/sys/kernel/hostname", f"{name}\n")
        host.write("/etc/hostname", f"{name}\n")
        hcas = ",".join(f"mlx5_{i}" for i in range(8))
        host.write(f"/proc/{pid}/environ", f"NCCL_DEBUG=INFO\0NCCL_DEBUG_FILE=/var/log/nccl/%h.%p.log\0"
                   f"NCCL_IB_HCA=={hcas}\0NCCL_IB_TIMEOUT=22\0PATH=/usr/bin\0")
        pre = f"{name}:{pid}:{pid + 7} [0] NCCL INFO "
        nccl = [f"{pre}NCCL version 2.21.5+cuda12.4", f"{pre}Using network IB",
                pre + "NET/IB : Using " + " ".join(f"[{i}]mlx5_{i}:1/IB" for i in range(8)) + " ; OOB eth0:10.0.0.1<0>",
                *(f"{pre}GPU Direct RDMA Enabled for GPU {g} / HCA {g} (distance 4 <= 4), read 1" for g in range(8))]
        for comm in ("0x7f3a8c000000", "0x7f3a94000000"):  # the world and one data-parallel communicator
            for c in range(32):
                g, n = c % 8, (c + 1) % 8
                # rank 0's own network channels leave through GPU0's rail NIC, mlx5_0 (PIX to it)
                nccl += [f"{pre}Channel {c:02d}/0 : {g}[{g}] -> {n}[{n}] via P2P/CUMEM/read",
                         f"{pre}Channel {c:02d}/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
                         f"{pre}Channel {c:02d}/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
                         f"{pre}Trees [{c}] 1/-1/-1->0->-1 [{c + 32}] -1/-1/-1->0->1"]
            nccl += [f"{pre}Connected all rings, use ring PXN 0 GDR 1",
                     f"{pre}comm {comm} rank 0 nranks 1024 cudaDev 0 nvmlDev 0 busId 18000 commId "
                     f"0x5c1f7e0a9b3d{comm[-8:-4]} - Init COMPLETE"]
        steps = [f"[rank0]: step {s} | loss {3.2 - s / 2000:.4f} | lr 3.000e-04 | grad_norm 0.912 | tokens/s 412345"
                 for s in range(3000)]
        host.write(f"/var/log/nccl/{name}.{pid}.log", "\n".join(nccl + steps) + "\n")
        return host
