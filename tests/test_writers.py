"""collectors/nccl/writers.py: which names this node's own processes print (issue 25, attribution by writer)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from collectors.nccl.writers import Writers, pod_hostnames, short_host
from gna_sdk.hostroot import HostRoot
from sim.host import SimHost


def test_a_pod_s_hostnames_are_its_name_and_its_name_without_a_generated_suffix() -> None:
    # an Indexed Job's / JobSet's pod: spec.hostname "<job>-<index>", name "<job>-<index>-<5 random>"
    assert pod_hostnames("llama-worker-3-x7k2p") == {"llama-worker-3-x7k2p", "llama-worker-3"}
    # a StatefulSet's or PyTorchJob's pod: its name is its hostname; "-0" is no generated suffix
    assert pod_hostnames("llama-worker-0") == {"llama-worker-0"}
    # "aeiou" are never in generateName's alphabet: a word that looks random but is not is kept whole
    assert pod_hostnames("train-audio") == {"train-audio"}
    # the kubelet cuts at 63 and trims trailing '-' and '.'
    long = "a" * 62 + "-b"
    assert pod_hostnames(long) == {"a" * 62}


@given(st.text(max_size=300))
def test_pod_hostnames_of_any_name_are_short_and_dotless(name: str) -> None:
    for h in pod_hostnames(name):
        assert 0 < len(h) <= 63 and "." not in h


def test_short_host_is_nccl_s_cut() -> None:
    assert short_host("gpu-0007.cluster.local\n") == "gpu-0007"


def test_the_node_its_pods_its_containers_and_own_hosts_are_this_node_s(tmp_path: Path) -> None:
    host = SimHost(tmp_path / "h")
    host.p("/var/log/pods/team-a_llama-worker-3-x7k2p_0b1f7f0e-2d1c-4a53-9d4e-1c2b3a4d5e6f/trainer").mkdir(
        parents=True)
    # a containerised process: host pid 91234 is pid 57 in its namespace; containerd set HOSTNAME
    host.write("/proc/91234/status", "Name:\tpython\nNSpid:\t91234\t57\n")
    host.write("/proc/91234/environ", "PATH=/usr/bin\0HOSTNAME=custom-name\0")
    # a host process claiming a name (one pid namespace): no evidence it is anything but the host's
    host.write("/proc/4242/status", "Name:\tpython\nNSpid:\t4242\n")
    host.write("/proc/4242/environ", "HOSTNAME=gpu-b\0")
    w = Writers(HostRoot(host.root), "gpu-a", own_hosts=["login-*"])
    assert w.local("gpu-a") and w.local("gpu-a", 12345)
    assert w.local("llama-worker-3", 57) and w.local("llama-worker-3-x7k2p")
    assert w.local("custom-name", 57)  # NSpid and HOSTNAME: a process of this node
    assert not w.local("custom-name", 58)  # the same name, another pid: not found here
    assert w.host_pid("custom-name", 57) == 91234
    assert not w.local("gpu-b", 4242)  # another node's name: the host's own process does not make it ours
    assert w.local("login-7")
    assert not w.local("") and not w.local("llama-worker-4", 57)


def test_a_file_on_a_network_filesystem_is_shared(tmp_path: Path) -> None:
    """proc(5) mountinfo, the longest mount point wins; the point's spaces are octal-escaped."""
    host = SimHost(tmp_path / "h")
    host.write("/proc/1/mountinfo",
               "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
               "40 22 0:45 / /home rw,relatime - nfs4 fs01:/home rw,vers=4.2\n"
               "41 40 8:2 / /home/local\\040scratch rw - xfs /dev/sdb1 rw\n"
               "42 22 0:50 / /mnt/jfs rw - fuse.juicefs JuiceFS:ai rw\n")
    w = Writers(HostRoot(host.root), "gpu-a")
    assert w.shared("/home/alice/logs/llama-3.out") is True
    assert w.shared("/home/local scratch/x.log") is False
    assert w.shared("/mnt/jfs/runs/slurm-1234.out") is True
    assert w.shared("/var/spool/slurm/job1234/slurm-1234.out") is False
    assert Writers(HostRoot(tmp_path / "empty"), "gpu-a").shared("/home/x") is None  # a snapshot: unknown
