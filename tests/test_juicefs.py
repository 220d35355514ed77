from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from collectors import juicefs as jmod
from collectors.formats.juicefs_files import (
    GIB,
    MIB,
    parse_config,
    parse_mount_argv,
    parse_mounts,
    parse_size,
    parse_stats,
    redact_meta_url,
    stat_value,
)
from gna_sdk.hostroot import HostRoot
from sim.host import SimHost
from tests.conftest import Sink

EMPTYDIR = "/var/lib/kubelet/pods/3f1c2b4a-aaaa-bbbb-cccc-1234567890ab/volumes/kubernetes.io~empty-dir/jfs-cache"




def _collector(root: Path, sink: Sink, facts: FactStore | None = None, **cfg: object) -> jmod.JuiceFSCollector:
    em = CollectorEmitter("n", "juicefs", sink, ConditionTracker(None), facts=facts or FactStore())
    conf = jmod.JuiceFSConfig(**{"cold_start_grace": 0.0, **cfg})  # type: ignore[arg-type]
    return jmod.JuiceFSCollector(conf, HostRoot(root), em)


# -- parsers ------------------------------------------------------------------------------

def test_parsers() -> None:
    m = parse_mounts("JuiceFS:myjfs /mnt/my\\040jfs fuse.juicefs rw,relatime 0 0\nbad\n")
    assert [(x.source, x.mountpoint, x.fstype) for x in m] == [("JuiceFS:myjfs", "/mnt/my jfs", "fuse.juicefs")]
    stats = parse_stats('juicefs_blockcache_hits 10\nfoo{method="GET"} 3\nfoo{method="PUT"} 4\ngarbage\nx NaN\n# c\n')
    assert stats.values == {"juicefs_blockcache_hits": 10.0, "foo_GET": 3.0, "foo_PUT": 4.0}
    assert stats.edition == "ce" and stats.bad_lines == 2 and stats.sample == "garbage"
    assert stat_value(stats.values, "foo_GET") == 3.0
    assert parse_size("100") == 100 * MIB and parse_size("100G") == 100 * GIB and parse_size("1.5Gi") == int(1.5 * GIB)
    assert parse_size("lots") is None
    v10 = parse_config(json.dumps({"Version": "1.0.4", "Chunk": {"CacheDir": "/a:/b", "CacheSize": 100}}), "/m")
    v11 = parse_config(json.dumps({"Version": "1.1.0", "Chunk": {"CacheSize": 100 * MIB}}), "/m")
    assert v10 and v10.cache_size == 100 * MIB and v10.cache_dirs == ["/a", "/b"]
    assert v11 and v11.cache_size == 100 * MIB
    assert parse_config("[1]", "/m") is None and parse_config("{", "/m") is None
    s = parse_mount_argv(["/usr/local/bin/juicefs", "mount", "-d", "--cache-size", "100",
                          "redis://u:pw@10.0.0.1:6379/1", "/mnt/jfs", "--cache-dir=/dev/shm/jfs", "--prefetch=0"])
    assert s and (s.mountpoint, s.cache_size, s.cache_dirs, s.prefetch) == ("/mnt/jfs", 100 * MIB, ["/dev/shm/jfs"], 0)
    assert parse_mount_argv(["python", "train.py"]) is None
    assert redact_meta_url("redis://u:pw@10.0.0.1:6379/1") == "redis://u:***@10.0.0.1:6379/1"


@given(st.text(max_size=500))
def test_stats_and_mount_parsers_never_crash(text: str) -> None:
    stats = parse_stats(text)
    for v in stats.values.values():
        assert v == v and v not in (float("inf"), float("-inf"))
    assert stats.bad_lines <= len(text.splitlines()) and (stats.sample == "") == (stats.bad_lines == 0)
    for m in parse_mounts(text):
        assert m.fstype


@given(st.lists(st.text(min_size=1, max_size=20), max_size=12))
def test_argv_parser_never_crashes(argv: list[str]) -> None:
    parse_mount_argv(["juicefs", "mount", *argv])


# -- scenarios --------------------------------------------------------------------------

async def test_healthy_mount_is_quiet(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.add_juicefs("/mnt/jfs", "/var/jfsCache")
    sink, facts = Sink(), FactStore()
    c = _collector(host.root, sink, facts, min_reads=10)
    await c.collect()
    host.juicefs_stats("/mnt/jfs", hits=900, miss=100)
    await c.collect()
    assert sink.messages == []
    assert facts.get("juicefs.mounts")[0]["cache_dirs"][0].startswith("/var/jfsCache/")


async def test_emptydir_tmpfs_overlay_and_memory_are_ephemeral(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.add_mount("overlay", "/", "overlay")  # a container's root
    host.add_juicefs("/mnt/a", EMPTYDIR, volume="a")
    host.add_juicefs("/mnt/b", "/dev/shm/jfs", volume="b")
    host.add_juicefs("/mnt/c", "/tmp/jfs", volume="c")  # on the overlay root now
    host.write("/proc/77/cmdline", "juicefs\0mount\0redis://x:secret@h/1\0/mnt/d\0--cache-dir=memory\0")
    host.add_mount("JuiceFS:d", "/mnt/d", "fuse.juicefs")  # no .config: settings from the command line
    sink = Sink()
    await _collector(host.root, sink, ephemeral_severity="critical").collect()
    eph = {(m.entity.split(":")[1], m.reason, m.severity) for m in sink.messages if m.type == "JuiceFSCacheEphemeral"}
    assert eph == {("/mnt/a", "emptyDir", "critical"), ("/mnt/b", "tmpfs", "critical"),
                   ("/mnt/c", "overlay", "critical"), ("/mnt/d", "memory", "critical")}
    assert all("secret" not in json.dumps(m.details) for m in sink.messages)


async def test_100_mib_cache_and_dataset_size(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.add_juicefs("/mnt/jfs", "/var/jfsCache", cache_size=100 * MIB)  # cache-size=100: MiB, not GiB
    host.add_juicefs("/mnt/big", "/var/jfsCache", volume="big", cache_size=200 * GIB)
    sink = Sink()
    mounts = [jmod.MountConfig(mountpoint="/mnt/big", dataset_bytes=2000 * GIB, dataset_paths=["/mnt/big/ckpt"])]
    await _collector(host.root, sink, mounts=mounts).collect()
    sus = {(m.entity, m.reason) for m in sink.messages if m.type == "JuiceFSCacheSizeSuspicious"}
    assert sus == {("juicefs:/mnt/jfs", "BelowFloor"), ("juicefs:/mnt/big", "BelowDataset")}


async def test_missing_dir_low_space_and_configured_unseen_mount(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.add_juicefs("/mnt/jfs", "/var/jfsCache", uuid="u-1")
    shutil.rmtree(host.p("/var/jfsCache/u-1"))  # the cache dir vanished (node re-imaged, disk swapped)
    host.add_juicefs("/mnt/huge", "/data/cache", volume="huge", cache_size=10**15, uuid="u-2")  # 1 PB: cannot grow
    host.p("/data/jfs-other").mkdir(parents=True)
    sink = Sink()
    mounts = [jmod.MountConfig(mountpoint="/mnt/other", cache_dirs=["/data/jfs-other"])]
    await _collector(host.root, sink, mounts=mounts).collect()
    got = sorted((m.type, m.entity, m.reason) for m in sink.messages)
    assert got == [("JuiceFSCacheDirMissing", "juicefs:/mnt/jfs:/var/jfsCache/u-1", "Missing"),
                   ("JuiceFSCacheLowSpace", "juicefs:/mnt/huge:/data/cache/u-2", "CannotGrow")]


async def test_hit_ratio_window_grace_and_read_amplification(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.add_juicefs("/mnt/jfs", "/var/jfsCache", prefetch=1)
    sink = Sink()
    c = _collector(host.root, sink, min_reads=1000)
    await c.collect()
    host.juicefs_stats("/mnt/jfs", hits=5, miss=50)  # too few reads to judge
    await c.collect()
    assert not [m for m in sink.messages if m.type == "JuiceFSCacheHitRatioLow"]
    host.juicefs_stats("/mnt/jfs", hits=50, miss=5000, object_get_bytes=10 * GIB, fuse_read_bytes=GIB)
    await c.collect()
    (low,) = [m for m in sink.messages if m.type == "JuiceFSCacheHitRatioLow"]
    assert low.details["hit_ratio"] < 0.02 and low.suggested_action == "warmup"
    (amp,) = [m for m in sink.messages if m.type == "JuiceFSReadAmplification"]
    assert amp.details["amplification"] == 10.0
    # during the cold-start grace nothing is judged
    sink2 = Sink()
    c2 = _collector(host.root, sink2, min_reads=1000, cold_start_grace=3600.0)
    await c2.collect()
    host.juicefs_stats("/mnt/jfs", hits=60, miss=9000)
    await c2.collect()
    assert sink2.messages == []
    fams = {f.name: f for f in c.prometheus_families()}
    assert fams["gna_juicefs_hit_ratio"].samples[0].value < 0.02


def _can_mount_tmpfs() -> bool:
    d = tempfile.mkdtemp()
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d], capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", d], check=False)
        return ok
    except FileNotFoundError:
        return False
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _fs_type(path: Path) -> str:
    """The live host's filesystem type under ``path`` (the longest mount point above it)."""
    best, kind = "", ""
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        for line in fh:
            f = line.split()
            if len(f) > 2 and len(f[1]) > len(best) and (str(path) + "/").startswith(f[1].rstrip("/") + "/"):
                best, kind = f[1], f[2]
    return kind


def _disk_dir() -> Path | None:
    """A directory on a real disk: the tests' tmp_path may be on tmpfs (tests/host_guard.py)."""
    for d in (Path(tempfile.gettempdir()), Path(__file__).resolve().parent):
        if _fs_type(d.resolve()) not in ("tmpfs", "ramfs", "") and os.access(d, os.W_OK):
            return d
    return None


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="cannot mount tmpfs here (needs CAP_SYS_ADMIN in this namespace)")
@pytest.mark.skipif(_disk_dir() is None, reason="neither the temporary directory nor the checkout is on a disk")
async def test_real_tmpfs_vs_real_disk_on_the_live_host(tmp_path: Path) -> None:
    tmpfs = tmp_path / "ram-cache"
    tmpfs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(tmpfs)], check=True)
    disk = Path(tempfile.mkdtemp(prefix="gna-disk-cache-", dir=_disk_dir()))
    try:
        sink = Sink()
        mounts = [jmod.MountConfig(mountpoint="/nonexistent/a", cache_dirs=[str(tmpfs)]),
                  jmod.MountConfig(mountpoint="/nonexistent/b", cache_dirs=[str(disk)])]
        await _collector(Path("/"), sink, mounts=mounts).collect()
    finally:
        subprocess.run(["umount", str(tmpfs)], check=False)
        shutil.rmtree(disk, ignore_errors=True)
    eph = [(m.entity, m.reason) for m in sink.messages if m.type == "JuiceFSCacheEphemeral"]
    assert eph == [(f"juicefs:/nonexistent/a:{tmpfs}", "tmpfs")]


async def test_empty_cache_is_cold_and_a_warmup_candidate(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.add_juicefs("/mnt/jfs", "/var/jfsCache", blocks=0)  # recreated: nothing cached
    sink, facts = Sink(), FactStore()
    mounts = [jmod.MountConfig(mountpoint="/mnt/jfs", dataset_paths=["/mnt/jfs/train"])]
    c = _collector(host.root, sink, facts, mounts=mounts)
    await c.collect()  # the first pass reads .stats
    await c.collect()
    cold = [m for m in sink.messages if m.type == "JuiceFSCacheCold"]
    assert cold and cold[0].suggested_action == "warmup" and cold[0].severity == "info"
    info = facts.get("juicefs.mounts")[0]
    assert info["cold"] is True and info["cold_paths"] == ["/mnt/jfs/train"] and info["warmup_running"] is False
    host.write("/proc/999/cmdline", "juicefs\0warmup\0--threads\0050\0/mnt/jfs/train\0")
    await c.collect()
    assert facts.get("juicefs.mounts")[0]["warmup_running"] is True


# -- real `.stats` contents, verbatim excerpts ---------------------------------------------------
def test_ce_duplicate_get_lines_are_summed() -> None:
    # juicedata/juicefs#5687 (v1.2+: storage_class dropped from the name, two lines remain)
    s = parse_stats("juicefs_object_request_data_bytes_GET 99108970949790\n"
                    "juicefs_object_request_data_bytes_GET 93296720741168\n")
    assert s.values == {"juicefs_object_request_data_bytes_GET": 99108970949790 + 93296720741168.0}


def test_ce_v1_0_dump_from_fluid() -> None:
    # fluid-cloudnative/fluid pkg/ddc/juicefs/report_test.go mockJuiceFSMetricOfCommunity() @9525a2d9d
    s = parse_stats("juicefs_blockcache_hit_bytes 40717671794\njuicefs_blockcache_hits 9709\njuicefs_blockcache_miss 0\n"
                    "juicefs_blockcache_read_hist_seconds_total 9709\n"
                    "juicefs_blockcache_read_hist_seconds_sum 973.9802880359989\n"
                    "juicefs_fuse_read_size_bytes_total 310652\njuicefs_fuse_read_size_bytes_sum 40717671794\n"
                    "juicefs_go_build_info__github.com/juicedata/juicefs_(devel) 1\njuicefs_go_info_go1.16.15 1\n"
                    "juicefs_object_request_errors 0\njuicefs_process_virtual_memory_max_bytes -1\n")
    assert s.edition == "ce" and s.bad_lines == 0
    assert s.values["juicefs_blockcache_hits"] == 9709 and s.values["juicefs_fuse_read_size_bytes_sum"] == 40717671794


def test_ee_dump_maps_onto_ce_names() -> None:
    # fluid-cloudnative/fluid pkg/ddc/juicefs/report_test.go @7dea2091b (PR #1829): Enterprise `key: value`
    s = parse_stats("blockcache.bytes: 536315271087\nblockcache.hitBytes: 8341055360094\nblockcache.hits: 2590312\n"
                    "blockcache.miss: 1002930\nblockcache.missBytes: 1935703021973\nfuse_ops.read: 29264056\n"
                    "fuse_ops: 126562751\nget_bytes: 4137587\nmeta.usec_ping: [407]\nobject.get: 41\n"
                    "object.put: 1173014\nput_bytes: 1134075243126\nread_bytes: 3269189737736\n"
                    "write_bytes: 2410711988610\n")
    assert s.edition == "ee" and s.bad_lines == 0, s.sample
    v = s.values
    assert (v["juicefs_blockcache_hits"], v["juicefs_blockcache_miss"]) == (2590312, 1002930)
    assert v["juicefs_object_request_data_bytes_GET"] == 4137587
    assert v["juicefs_fuse_read_size_bytes_sum"] == 3269189737736 and v["object.get"] == 41
