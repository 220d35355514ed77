"""collectors/nccl/hang_evidence.py and gna_sdk/hostroot.open_untrusted: the paths a job's environment names never lead
the agent out of the host root, whatever the job swaps in between, and RAS is asked only on this node."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.nccl import hang_evidence as nccl_live
from collectors.nccl.hang_evidence import (
    PROVENANCE_TENANT,
    Candidate,
    FlightRecords,
    RasAsker,
    local_addresses,
    ras_address_allowed,
    read_environ,
)
from gna_sdk import hostroot
from gna_sdk.hostroot import HostRoot, UnsafePath, open_untrusted, split_beneath

CORPUS = Path(__file__).resolve().parent / "corpus"
DUMP = CORPUS / "flight_recorder" / "hang_rank_0"


@pytest.fixture(params=["openat2", "walk"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every test of the opener runs twice: through openat2 (skipped where the kernel or a seccomp profile
    lacks it) and through the O_NOFOLLOW walk, forced by marking openat2 unusable."""
    if request.param == "openat2":
        if not hostroot._openat2.usable:
            pytest.skip("openat2 is not usable here (kernel < 5.6, seccomp, or another architecture)")
    else:
        monkeypatch.setattr(hostroot._openat2, "usable", False)
    yield request.param


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    (root / "tmp").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s3cret")
    (root / "tmp" / "inside").write_text("y")
    return root, outside


def _reason(root: Path, path: str, **kw: Any) -> str | None:
    try:
        with open_untrusted(root, path, max_bytes=1 << 20, **kw) as f:
            assert f.read(100) != b"s3cret"
            return None
    except UnsafePath as e:
        return e.reason


def test_symlinks_anywhere_and_dotdot_above_the_root_are_refused(tmp_path: Path, backend: str) -> None:
    root, outside = _tree(tmp_path)
    (root / "tmp" / "escape").symlink_to(outside / "secret")  # the last component
    (root / "dir").symlink_to(outside)  # a directory on the way
    (root / "tmp" / "link_in").symlink_to(root / "tmp" / "inside")  # stays inside: still a symlink
    (root / "rel").symlink_to("tmp")
    assert _reason(root, "/tmp/inside") is None and _reason(root, "tmp/./inside") is None
    assert _reason(root, "/tmp/../tmp/inside") is None  # ".." that stays inside is applied lexically
    assert _reason(root, "/tmp/escape") == "symlink"
    assert _reason(root, "/dir/secret") == "symlink"
    assert _reason(root, "/tmp/link_in") == "symlink"
    assert _reason(root, "/rel/inside") == "symlink"
    assert _reason(root, "/../outside/secret") == "escapes_root"  # refused, not clamped
    assert _reason(root, f"../{outside.name}/secret") == "escapes_root"
    assert _reason(root, "/tmp/absent") == "missing" and _reason(root, "/tmp/inside/x") == "missing"
    assert _reason(root, "/tmp") == "not_regular"
    assert _reason(root, "/tmp/in\0side") == "bad_name" and _reason(root, "/" + "a" * 256) == "bad_name"


def test_fifos_hard_links_and_big_files_are_refused_on_the_descriptor(tmp_path: Path, backend: str) -> None:
    root, _ = _tree(tmp_path)
    os.mkfifo(root / "tmp" / "trace.pipe")  # TORCH_NCCL_DEBUG_INFO_PIPE_FILE: would block an O_RDONLY open
    os.link(root / "tmp" / "inside", root / "tmp" / "hard")
    (root / "tmp" / "big").write_bytes(b"x" * 2048)
    assert _reason(root, "/tmp/trace.pipe") == "not_regular"
    assert _reason(root, "/tmp/hard") == "hard_linked" and _reason(root, "/tmp/hard", allow_links=True) is None
    with pytest.raises(UnsafePath) as e:
        open_untrusted(root, "/tmp/big", max_bytes=1024)
    assert e.value.reason == "too_large"
    with open_untrusted(root, "/tmp/big", max_bytes=4096) as f:  # a descriptor root works the same
        assert f.read(10) == b"x" * 10 and f.stat.st_size == 2048


def test_a_directory_swapped_for_a_symlink_after_the_old_check_is_refused(tmp_path: Path, backend: str) -> None:
    """The #20 attack: the old code checked ``realpath`` inside the root, then opened the path. Here the swap
    happens after every check the caller could make and right before the opener runs: the directory the
    check saw is replaced by a symlink to a directory outside holding a dump. The opener is the check."""
    root, outside = _tree(tmp_path)
    (root / "scratch" / "fr").mkdir(parents=True)
    shutil.copy(DUMP, root / "scratch" / "fr" / "trace_0")
    shutil.copy(DUMP, outside / "trace_0")
    real = os.path.realpath(root / "scratch" / "fr" / "trace_0")
    assert real.startswith(str(root) + "/")  # what contained() used to check: it passed

    os.rename(root / "scratch" / "fr", root / "scratch" / "fr.old")  # the job user's swap, after the check
    os.symlink(outside, root / "scratch" / "fr")
    assert _reason(root, "/scratch/fr/trace_0") == "symlink"


def test_the_walk_reads_through_the_directory_it_opened_not_a_name_swapped_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the fallback walk, a swap between two components changes nothing: each component is opened from
    the descriptor of the one before, so the file read is the one in the directory that was opened."""
    monkeypatch.setattr(hostroot._openat2, "usable", False)
    root, outside = _tree(tmp_path)
    (root / "scratch" / "fr").mkdir(parents=True)
    (root / "scratch" / "fr" / "trace_0").write_text("inside")
    (outside / "trace_0").write_text("s3cret")
    real_open = os.open
    swapped: list[str] = []

    def open_then_swap(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        if path == "fr" and not swapped:  # the walk holds fr's descriptor: now swap the name for a symlink
            os.rename(root / "scratch" / "fr", root / "scratch" / "fr.old")
            os.symlink(outside, root / "scratch" / "fr")
            swapped.append(path)
        return fd

    monkeypatch.setattr(hostroot.os, "open", open_then_swap)
    with open_untrusted(root, "/scratch/fr/trace_0", max_bytes=100) as f:
        data = f.read(100)
    monkeypatch.undo()
    assert swapped == ["fr"] and data == b"inside"
    assert _reason(root, "/scratch/fr/trace_0") == "symlink"  # and the next open sees the symlink


@given(st.lists(st.sampled_from(["a", "..", ".", "", "b", "...", "c d"]), max_size=8))
def test_split_beneath_never_leaves_the_root(parts: list[str]) -> None:
    path = "/".join(parts)
    try:
        out = split_beneath(path)
    except UnsafePath as e:
        assert e.reason == "escapes_root"
        return
    assert ".." not in out and "." not in out and "" not in out
    assert os.path.normpath("/r/" + path).startswith("/r")


def _emit() -> Any:
    from agent.emitter import CollectorEmitter, ConditionTracker
    from agent.facts import FactStore
    from tests.conftest import Sink

    sink = Sink()
    return sink, CollectorEmitter("gpu-a", "nccl_logs", sink, ConditionTracker(None), facts=FactStore())


def _proc(root: Path, pid: int, environ: str, uid: int | None) -> None:
    (root / "proc" / str(pid)).mkdir(parents=True)
    (root / "proc" / str(pid) / "environ").write_bytes(environ.encode())
    if uid is not None:
        (root / "proc" / str(pid) / "status").write_text(f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")


def test_a_job_environment_cannot_point_the_agent_outside(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(DUMP, tmp_path / "elsewhere" / "trace_0")
    _proc(root, 7, f"RANK=0\0TORCH_FR_DUMP_TEMP_FILE=/../../{tmp_path.name}/elsewhere/trace_\0", os.getuid())
    os.symlink(tmp_path / "elsewhere", root / "data")
    _proc(root, 8, "RANK=0\0TORCH_FR_DUMP_TEMP_FILE=/data/trace_\0", os.getuid())
    sink, em = _emit()
    fr = FlightRecords(HostRoot(root), em)
    assert all(c.path != f"/../../{tmp_path.name}/elsewhere/trace_0" for c in fr.candidates(7, None))
    assert fr.errors == {"escapes_root": 1}
    assert Candidate("/", "/data/trace_0") in fr.candidates(8, None)  # lexical only: opening decides
    assert not asyncio.run(fr.collect(8, None, "nccl:gpu-a:8", {}))
    assert fr.errors == {"escapes_root": 1, "symlink": 1} and not sink.messages and fr.records == 0
    assert not asyncio.run(fr.collect(8, None, "nccl:gpu-a:8", {}))  # each refusal counted once
    assert fr.errors == {"escapes_root": 1, "symlink": 1}


def test_a_swap_after_the_candidates_were_listed_is_refused_by_the_open(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The old code checked the path in candidates() and opened it in collect(). Now candidates() looks at
    no file; a directory swapped for a symlink right before each open (the hook) is refused by the open."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(DUMP, outside / "trace_0")
    (root / "scratch" / "fr").mkdir(parents=True)
    shutil.copy(DUMP, root / "scratch" / "fr" / "trace_0")
    _proc(root, 9, "RANK=0\0TORCH_FR_DUMP_TEMP_FILE=/scratch/fr/trace_\0", os.getuid())
    sink, em = _emit()
    fr = FlightRecords(HostRoot(root), em)
    real = nccl_live.open_untrusted

    def swap_then_open(*a: Any, **kw: Any) -> Any:
        if not (root / "scratch" / "fr").is_symlink():
            os.rename(root / "scratch" / "fr", root / "scratch" / "fr.old")
            os.symlink(outside, root / "scratch" / "fr")
        return real(*a, **kw)

    monkeypatch.setattr(nccl_live, "open_untrusted", swap_then_open)
    assert not asyncio.run(fr.collect(9, 0, "nccl:gpu-a:9", {}))
    assert fr.errors == {"symlink": 1} and not sink.messages


def test_only_the_process_owner_s_dumps_are_read_and_records_say_tenant(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "scratch").mkdir(parents=True)
    shutil.copy(DUMP, root / "scratch" / "trace_0")
    _proc(root, 10, "RANK=0\0TORCH_FR_DUMP_TEMP_FILE=/scratch/trace_\0", os.getuid() + 1)  # another user's job
    _proc(root, 11, "RANK=0\0TORCH_FR_DUMP_TEMP_FILE=/scratch/trace_\0", None)  # owner unknown
    sink, em = _emit()
    fr = FlightRecords(HostRoot(root), em)
    assert not asyncio.run(fr.collect(10, 0, "nccl:gpu-a:10", {}))
    assert not asyncio.run(fr.collect(11, 0, "nccl:gpu-a:11", {}))
    assert fr.errors == {"foreign_owner": 1} and not sink.messages  # one path, one reason: counted once
    _proc(root, 12, "RANK=0\0TORCH_FR_DUMP_TEMP_FILE=/scratch/trace_\0", os.getuid())
    assert asyncio.run(fr.collect(12, 0, "nccl:gpu-a:12", {"job": "0xabc"}))
    (rec,) = sink.of("TorchFlightRecord")
    assert rec.details["provenance"] == PROVENANCE_TENANT == "tenant" and rec.details["dump"] == "/scratch/trace_0"
    assert not asyncio.run(fr.collect(12, 0, "nccl:gpu-a:12", {}))  # read once


def test_a_dump_in_the_process_s_mount_namespace_is_read_under_its_root(tmp_path: Path) -> None:
    """/proc/<pid>/root is the root the job's paths are resolved under: a symlink inside the job's tree that
    points at "/etc" means the host's /etc to an agent that follows it; here it is refused."""
    root = tmp_path / "root"
    job = tmp_path / "jobroot"
    (job / "home" / "u" / ".cache" / "torch").mkdir(parents=True)
    shutil.copy(DUMP, job / "home" / "u" / ".cache" / "torch" / "comm_lib_trace_rank_0")
    _proc(root, 13, "RANK=0\0HOME=/home/u\0", os.getuid())
    (root / "proc" / "13" / "root").symlink_to(job)  # the kernel's magic link, in a test tree
    sink, em = _emit()
    fr = FlightRecords(HostRoot(root), em)
    assert asyncio.run(fr.collect(13, 0, "nccl:gpu-a:13", {}))
    (rec,) = sink.of("TorchFlightRecord")
    assert rec.details["dump"] == "/proc/13/root/home/u/.cache/torch/comm_lib_trace_rank_0"
    os.rename(job / "home" / "u" / ".cache", job / "home" / "u" / "cache.real")
    (job / "home" / "u" / ".cache").symlink_to("/home/u/cache.real")
    shutil.copy(DUMP, job / "home" / "u" / "cache.real" / "torch" / "comm_lib_trace_rank_1")
    assert not asyncio.run(fr.collect(13, 1, "nccl:gpu-a:13", {}))
    assert fr.errors.get("symlink", 0) >= 1


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # one file, rewritten per example
@given(data=st.binary(max_size=2048))
def test_any_environ_parses_to_strings(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "proc" / "1").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc" / "1" / "environ").write_bytes(data)
    env = read_environ(HostRoot(tmp_path), 1)
    assert env is not None and all(isinstance(k, str) and k and isinstance(v, str) for k, v in env.items())
    assert all("\0" not in k and "=" not in k for k in env)


# -- RAS: loopback or this node's own addresses only --------------------------------------------------

FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 10.10.0.0/16 2 0 2
        |-- 10.10.0.0
           /16 link UNICAST
        |-- 10.10.1.12
           /32 host LOCAL
        |-- 10.10.255.255
           /32 link BROADCAST
Local:
  +-- 0.0.0.0/0 3 0 5
     |-- 10.10.1.12
        /32 host LOCAL
     |-- 127.0.0.0
        /8 host LOCAL
"""
IF_INET6 = ("fe8000000000000000fc00fffe000001 04 40 20 80     eth0\n"
            "fd000000000000000000000000000002 04 40 00 82     eth0\n"
            "00000000000000000000000000000001 01 80 10 80       lo\n")


def test_local_addresses_come_from_the_host_root_s_proc_net(tmp_path: Path) -> None:
    (tmp_path / "proc" / "net").mkdir(parents=True)
    (tmp_path / "proc" / "net" / "fib_trie").write_text(FIB_TRIE)
    (tmp_path / "proc" / "net" / "if_inet6").write_text(IF_INET6)
    local = local_addresses(HostRoot(tmp_path))
    assert local == {ipaddress.ip_address(a) for a in ("10.10.1.12", "fe80::fc:ff:fe00:1", "fd00::2", "::1")}
    assert ras_address_allowed("127.0.0.1", local) is None and ras_address_allowed("127.3.2.1", local) is None
    assert ras_address_allowed("::1", local) is None and ras_address_allowed("10.10.1.12", local) is None
    assert ras_address_allowed("::ffff:10.10.1.12", local) is None and ras_address_allowed("fe80::fc:ff:fe00:1%eth0",
                                                                                           local) is None
    for other in ("10.10.1.13", "10.10.255.255", "10.10.0.0", "0.0.0.0", "8.8.8.8", "fd00::3", "::ffff:10.10.1.13"):
        assert ras_address_allowed(other, local) == "not_local", other
    assert ras_address_allowed("not-an-ip", local) == "address"
    assert local_addresses(HostRoot(tmp_path / "nothing")) == frozenset()


async def test_ras_at_another_host_is_refused_without_connecting_and_answers_say_tenant(tmp_path: Path) -> None:
    """#20: the job sets NCCL_RAS_ADDR to a host:port of its choosing. A loopback port is asked (and its answer
    marked tenant-supplied); a port on another host is never connected to, and counted once per reason."""
    from tests.fake_ras import FakeRas

    report = (CORPUS / "ras" / "v2.30.7-dead-and-timeouts.txt").read_text()
    root = tmp_path / "root"
    (root / "proc" / "net").mkdir(parents=True)
    (root / "proc" / "net" / "fib_trie").write_text(FIB_TRIE)
    sink, em = _emit()
    async with FakeRas(report) as ras:
        _proc(root, 4301, f"NCCL_RAS_ADDR=10.10.1.13:{ras.port}\0", os.getuid())  # a peer's address
        _proc(root, 4302, f"NCCL_RAS_ADDR=192.0.2.77:{ras.port}\0", os.getuid())
        _proc(root, 4303, f"NCCL_RAS_ADDR=[fd00::9]:{ras.port}\0", os.getuid())
        _proc(root, 4007, f"NCCL_RAS_ADDR=127.0.0.1:{ras.port}\0", os.getuid())
        asker = RasAsker(HostRoot(root), em, timeout=5.0)
        for pid in (4301, 4302, 4303):
            asker.on_hang(None, pid, f"nccl:gpu-a:{pid}", {})
        asker.on_hang("0x5b1e0c3f9a7d2e41", 4007, "nccl:gpu-a:4007", {"job": "0x5b1e0c3f9a7d2e41"})
        for _ in range(200):
            if not asker._tasks:
                break
            await asyncio.sleep(0.02)
        assert asker.errors == {"not_local": 3}
        assert ras.connections == 1  # only the loopback one
    (rep,) = sink.of("NCCLRASReport")
    assert rep.details["provenance"] == "tenant" and rep.details["ras_address"] == f"127.0.0.1:{ras.port}"
