"""What the kernel, the drivers and the tools write, read without policy: parsers and catalogs the collector
plugins share, each named for what it holds.

- ``kmsg_records``: /dev/kmsg records and their text renderings (journald, syslog, dmesg), NVIDIA's
  kernel-module lines.
- ``xid_catalog``: NVIDIA's Xid and SXid catalog (what each code means, how NVIDIA resolves it).
- ``ib_sysfs``: /sys/class/infiniband: port states, rates, counters.
- ``pcie_tree``: the PCIe tree from /sys/bus/pci: devices, bridges, links and the distance between two.
- ``juicefs_files``: JuiceFS on a node: /proc/mounts lines, ``<mount>/.stats``, ``.config``, mount argv.

NCCL's and PyTorch's formats live with the NCCL collector (collectors/nccl/: its rules, the RAS protocol,
Flight Recorder dumps).
"""
