"""Builder for simulated host roots: a directory laid out like a GPU node's /sys, /proc and /dev.

Tests, the demo and benchmarks share it; collector issues extend it with their own parts.
Layout follows the kernel (and node_exporter's sysfs fixtures): /sys/bus/pci/devices/<bdf> is a
relative symlink into /sys/devices/pci<domain>:<bus>/, /sys/module/<name>/initstate, /proc/modules.
"""

from __future__ import annotations

import os
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

    # -- GPUs ------------------------------------------------------------------------
    def add_gpu(self, bus_id: str, minor: int, device_id: str = H100_SXM, *, dev_node: bool = True) -> SimGPU:
        gpu = SimGPU(bus_id, minor, device_id)
        domain, bus = bus_id.split(":")[:2]
        real = f"/sys/devices/pci{domain}:{bus}/{bus_id}"
        self.write(f"{real}/vendor", f"{NVIDIA_VENDOR}\n")
        self.write(f"{real}/device", f"{device_id}\n")
        self.write(f"{real}/class", "0x030200\n")
        self.write(f"{real}/current_link_speed", "32.0 GT/s PCIe\n")
        self.write(f"{real}/current_link_width", "16\n")
        self.write(f"{real}/max_link_speed", "32.0 GT/s PCIe\n")
        self.write(f"{real}/max_link_width", "16\n")
        link = self.p(f"/sys/bus/pci/devices/{bus_id}")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(self.p(real), link.parent))
        self.write(f"/proc/driver/nvidia/gpus/{bus_id}/information",
                   f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t GPU-sim-{minor:04d}\n"
                   f"Bus Location: \t {bus_id}\nDevice Minor: \t {minor}\n")
        self.gpus.append(gpu)
        if dev_node:
            self.add_dev_node(f"nvidia{minor}")
        return gpu

    def add_other_pci(self, bus_id: str, vendor: str, klass: str) -> None:
        domain, bus = bus_id.split(":")[:2]
        real = f"/sys/devices/pci{domain}:{bus}/{bus_id}"
        self.write(f"{real}/vendor", f"{vendor}\n")
        self.write(f"{real}/class", f"{klass}\n")
        link = self.p(f"/sys/bus/pci/devices/{bus_id}")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(self.p(real), link.parent))

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
        import shutil

        shutil.rmtree(self.p(f"/sys/class/infiniband/{name}"))

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
        """An HGX-style node: ``gpus`` H100s, driver and device nodes present (healthy); with
        ``hcas`` NDR HCAs (mlx5_0..), an extra RoCE storage NIC when ``storage_nic``, and
        nvidia_peermem loaded when ``peermem``."""
        host = cls(Path(root))
        host.root.mkdir(parents=True, exist_ok=True)
        host.set_boot("00000000-0000-4000-8000-000000000001")
        host.add_mount("/dev/nvme0n1p2", "/", "ext4")
        host.add_mount("tmpfs", "/dev/shm", "tmpfs", "rw,nosuid,nodev")
        host.add_mount("/dev/nvme1n1", "/var/jfsCache", "xfs")
        host.p("/dev").mkdir(parents=True, exist_ok=True)
        host.p("/dev/kmsg").touch()
        buses = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db", "1b", "2b", "3b", "4b", "5b", "6b", "7b", "8b"]
        for i in range(gpus):
            host.add_gpu(f"0000:{buses[i % len(buses)]}:00.0", i, dev_node=driver_loaded)
        host.add_other_pci("0000:00:00.0", "0x8086", "0x060000")  # host bridge: not a GPU
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
            host.add_hca(f"mlx5_{i}")
        if storage_nic:
            host.add_hca(f"mlx5_{hcas}", link_layer="Ethernet", rate="200 Gb/sec (4X HDR)")
        if hcas and driver_loaded and peermem:
            host.load_module("nvidia_peermem", version="550.127.05")  # /sys/module/nvidia_peermem/version
        return host

    @classmethod
    def hgx_node(cls, root: str | Path) -> SimHost:
        """An HGX H100 node in training: 8 GPUs, 4 NVSwitches, 8 NDR HCAs and a RoCE storage NIC, a
        JuiceFS mount, and one running job (pid 4242) whose log under /var/log/nccl (the nccl_logs
        default glob) is mostly the trainer's own output with a few hundred healthy NCCL INFO lines."""
        host = cls.gpu_node(root, gpus=8, hcas=8, storage_nic=True)
        for bus in ("05", "06", "07", "08"):
            host.add_other_pci(f"0000:{bus}:00.0", NVIDIA_VENDOR, "0x068000")  # NVSwitch: bridge/other
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
                nccl += [f"{pre}Channel {c:02d}/0 : {g}[{g}] -> {n}[{n}] via P2P/CUMEM/read",
                         f"{pre}Channel {c:02d}/0 : 8[0] -> 0[0] [receive] via NET/IB/{g}/GDRDMA",
                         f"{pre}Channel {c:02d}/0 : 0[0] -> 8[0] [send] via NET/IB/{g}/GDRDMA",
                         f"{pre}Trees [{c}] 1/-1/-1->0->-1 [{c + 32}] -1/-1/-1->0->1"]
            nccl += [f"{pre}Connected all rings, use ring PXN 0 GDR 1",
                     f"{pre}comm {comm} rank 0 nranks 1024 cudaDev 0 nvmlDev 0 busId 18000 commId "
                     f"0x5c1f7e0a9b3d{comm[-8:-4]} - Init COMPLETE"]
        steps = [f"[rank0]: step {s} | loss {3.2 - s / 2000:.4f} | lr 3.000e-04 | grad_norm 0.912 | tokens/s 412345"
                 for s in range(3000)]
        host.write(f"/var/log/nccl/{name}.{pid}.log", "\n".join(nccl + steps) + "\n")
        return host
