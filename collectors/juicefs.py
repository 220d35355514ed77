"""JuiceFS caches that silently never hit, run out of space, or were sized in the wrong unit.

Mounts come from <host-root>/proc/mounts (fstype fuse.juicefs); settings from <mountpoint>/.config,
else from the `juicefs mount` command line in /proc/<pid>/cmdline; plus cache dirs listed in config
for mounts the agent cannot see. Counters come from <mountpoint>/.stats (no cache walk per poll).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import os
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import msgspec
from msgspec import structs

from collectors.formats.juicefs_files import (
    GIB,
    MountEntry,
    MountSettings,
    parse_config,
    parse_mount_argv,
    parse_mounts,
    parse_stats,
    stat_value,
    summarize_settings,
)
from gna_sdk import CollectorSettings, Emitter, HostPaths, Severity
from gna_types.detail_fields import UNSET, UnsetType
from gna_types.node_details import wire
from gna_types.storage_details import (
    JuiceFSCacheCold,
    JuiceFSCacheDir,
    JuiceFSCacheEphemeral,
    JuiceFSCacheHitRatioLow,
    JuiceFSCacheLowSpace,
    JuiceFSCacheSizeSuspicious,
    JuiceFSMount,
    JuiceFSReadAmplification,
)

EPHEMERAL_FS = {"tmpfs", "ramfs", "overlay", "overlayfs", "aufs"}
EMPTYDIR = "/var/lib/kubelet/pods/*/volumes/kubernetes.io~empty-dir/*"


class MountConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    mountpoint: str
    cache_dirs: list[str] = msgspec.field(default_factory=list)  # for mounts the agent cannot see
    dataset_paths: list[str] = msgspec.field(default_factory=list)  # what a warmup should pull in
    dataset_bytes: int = 0  # the working set; the cache should hold it


class JuiceFSConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    interval: float = 60.0
    mounts: list[MountConfig] = msgspec.field(default_factory=list)
    ephemeral_severity: Literal["warning", "critical"] = "warning"
    min_cache_bytes: int = GIB  # below: the MiB-vs-GiB mistake (cache-size=100 is 100 MiB)
    dataset_fraction: float = 0.5  # cache smaller than this share of dataset_bytes is suspicious
    hit_ratio_min: float = 0.5
    min_reads: int = 1000  # block reads in the window before a hit ratio means anything
    window: float = 600.0
    cold_start_grace: float = 600.0
    read_amplification_max: float = 3.0
    object_bytes_metric: str = "juicefs_object_request_data_bytes_GET"  # bytes downloaded from the object store
    read_bytes_metric: str = "juicefs_fuse_read_size_bytes_sum"


@dataclass
class MountState:
    first_seen: float
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)


class JuiceFSCollector:
    name: ClassVar[str] = "juicefs"
    config_type: ClassVar[type[JuiceFSConfig]] = JuiceFSConfig
    phase: ClassVar[int] = 30

    def __init__(self, config: JuiceFSConfig, host: HostPaths, emit: Emitter) -> None:
        self.config = config
        self.host = host
        self.emit = emit
        self.state: dict[str, MountState] = {}
        self.usage: dict[str, dict[str, float]] = {}

    # -- discovery ----------------------------------------------------------------------
    def _mounts(self) -> tuple[list[MountEntry], list[MountEntry]]:
        entries = parse_mounts(self.host.read_text("/proc/mounts", limit=4 << 20) or "")
        return [m for m in entries if m.fstype == "fuse.juicefs"], entries

    def _cmdlines(self) -> dict[str, MountSettings]:
        out: dict[str, MountSettings] = {}
        with contextlib.suppress(OSError):
            for pid in os.listdir(self.host.path("/proc")):
                if not pid.isdigit():
                    continue
                raw = self.host.read_text(f"/proc/{pid}/cmdline", limit=65536)
                if not raw or "juicefs" not in raw:
                    continue
                s = parse_mount_argv([a for a in raw.split("\0") if a])
                if s:
                    out[s.mountpoint.rstrip("/") or "/"] = s
        return out

    def _warmups(self) -> list[str]:
        running = []
        with contextlib.suppress(OSError):
            for pid in os.listdir(self.host.path("/proc")):
                raw = self.host.read_text(f"/proc/{pid}/cmdline", limit=65536) if pid.isdigit() else None
                if raw and "juicefs" in raw and "\0warmup\0" in f"\0{raw}\0":
                    running.append(raw.replace("\0", " ").strip())
        return running

    def _settings(self, mountpoint: str, cmdlines: dict[str, MountSettings]) -> MountSettings | None:
        text = self.host.read_text(f"{mountpoint.rstrip('/')}/.config", limit=1 << 20)
        if text:
            s = parse_config(text, mountpoint)
            if s:
                return s
        return cmdlines.get(mountpoint.rstrip("/") or "/")

    def _fs_of(self, path: str, entries: list[MountEntry]) -> MountEntry | None:
        best: MountEntry | None = None
        for m in entries:
            mp = m.mountpoint.rstrip("/") or "/"
            # a later line at the same mount point shadows an earlier one
            if (path == mp or path.startswith(mp + "/") or mp == "/") and (
                    best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/")):
                best = m
        return best

    # -- the pass -------------------------------------------------------------------------
    async def collect(self) -> None:
        jfs, entries = await asyncio.to_thread(self._mounts)
        cmdlines = await asyncio.to_thread(self._cmdlines)
        configured = {m.mountpoint.rstrip("/"): m for m in self.config.mounts}
        seen = {m.mountpoint.rstrip("/") for m in jfs}
        facts: list[dict[str, Any]] = []
        warmups = await asyncio.to_thread(self._warmups)
        for mp in sorted(seen | set(configured)):
            conf = configured.get(mp)
            settings = self._settings(mp, cmdlines) if mp in seen else None
            if settings is None:
                settings = MountSettings(mp, cache_dirs=list(conf.cache_dirs) if conf else [], source="config")
            if conf and conf.cache_dirs and not settings.cache_dirs:
                settings.cache_dirs = list(conf.cache_dirs)
            info = await self._check_mount(mp, settings, conf, entries, mounted=mp in seen)
            info["warmup_running"] = any(mp in w for w in warmups)
            facts.append(info)
        self.emit.facts.set("juicefs.mounts", facts)

    async def _check_mount(self, mp: str, s: MountSettings, conf: MountConfig | None, entries: list[MountEntry],
                           *, mounted: bool) -> dict[str, Any]:
        entity = f"juicefs:{mp}"
        base = JuiceFSMount(mountpoint=mp, mounted=mounted, **summarize_settings(s))
        mount = structs.asdict(base)
        cold = False
        for cache_dir in s.cache_dirs:
            if cache_dir == "memory":
                await self._ephemeral(entity, cache_dir, "memory", mount)
                cold = True
                continue
            path = self.host.path(cache_dir)
            exists = path.is_dir()
            writable = exists and os.access(path, os.W_OK)
            if not exists or not writable:
                await self.emit.condition(
                    "JuiceFSCacheDirMissing", firing=True, severity="critical", entity=f"{entity}:{cache_dir}",
                    reason="Missing" if not exists else "NotWritable",
                    message=f"JuiceFS cache dir {cache_dir} of {mp} is {'missing' if not exists else 'not writable'}:"
                            f" every read goes to the object store.",
                    details=wire(JuiceFSCacheDir(**mount, cache_dir=cache_dir)),
                    suggested_action="fix_config")
                cold = True
                continue
            fs = self._fs_of(cache_dir, entries)
            why = ("emptyDir" if fnmatch.fnmatch(cache_dir, EMPTYDIR) or "/kubernetes.io~empty-dir/" in cache_dir
                   else fs.fstype if fs and fs.fstype in EPHEMERAL_FS else "")
            if why:
                await self._ephemeral(entity, cache_dir, why, mount, filesystem=fs.fstype if fs else None,
                                      fs_mountpoint=fs.mountpoint if fs else None)
            await self._space(entity, cache_dir, s, mount)
            used = self._cache_usage(cache_dir, s)
            if used.get("blocks", 1) == 0 and mounted:
                cold = True
                # recreated or emptied (node re-imaged, disk swapped, Pod moved): a warmup candidate
                await self.emit.condition(
                    "JuiceFSCacheCold", firing=True, severity="info", entity=f"{entity}:{cache_dir}",
                    reason="EmptyCache", message=f"JuiceFS cache dir {cache_dir} of {mp} holds no blocks: "
                                                 f"every first read goes to the object store.",
                    details=wire(JuiceFSCacheCold(**mount, cache_dir=cache_dir,
                                                  dataset_paths=conf.dataset_paths if conf else [])),
                    suggested_action="warmup")
        size = s.cache_size
        if size is not None and s.cache_dirs != ["memory"]:
            small = size < self.config.min_cache_bytes
            want = conf.dataset_bytes if conf else 0
            if small or (want and size < want * self.config.dataset_fraction):
                await self.emit.condition(
                    "JuiceFSCacheSizeSuspicious", firing=True, severity="warning", entity=entity,
                    reason="BelowFloor" if small else "BelowDataset",
                    message=f"JuiceFS cache of {mp} is {size / (1 << 20):.0f} MiB"
                            + (" (cache-size is in MiB: 100 means 100 MiB, not GiB)" if small else
                               f", far below the {want / GIB:.0f} GiB dataset") + ".",
                    details=wire(JuiceFSCacheSizeSuspicious(**(mount | {"cache_size_bytes": size}),
                                                            dataset_bytes=want or None)),
                    suggested_action="fix_config")
        await self._stats(entity, mp, s, mount, mounted=mounted)
        return {"mountpoint": mp, "cache_dirs": s.cache_dirs, "dataset_paths": conf.dataset_paths if conf else [],
                "cold": cold, "cold_paths": (conf.dataset_paths if conf and cold else [])}

    async def _ephemeral(self, entity: str, cache_dir: str, why: str, mount: dict[str, Any], *,
                         filesystem: str | UnsetType | None = UNSET,
                         fs_mountpoint: str | UnsetType | None = UNSET) -> None:
        sev: Severity = self.config.ephemeral_severity
        where = {"memory": "in memory", "emptyDir": "on a kubelet emptyDir",
                 "overlay": "on the container's overlay layer"}.get(why, f"on {why}")
        await self.emit.condition(
            "JuiceFSCacheEphemeral", firing=True, severity=sev, entity=f"{entity}:{cache_dir}", reason=why,
            message=f"JuiceFS cache dir {cache_dir} lives {where}: it dies with the Pod or process, so the hit "
                    f"rate stays near zero.",
            details=wire(JuiceFSCacheEphemeral(**mount, filesystem=filesystem, fs_mountpoint=fs_mountpoint,
                                               cache_dir=cache_dir, why=why)),
            suggested_action="fix_config")

    async def _space(self, entity: str, cache_dir: str, s: MountSettings, mount: dict[str, Any]) -> None:
        try:
            st = os.statvfs(self.host.path(cache_dir))
        except OSError:
            return
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        ratio = free / total if total else 1.0
        used = self.usage.get(cache_dir, {}).get("bytes", 0.0)
        want_ratio = s.free_space_ratio if s.free_space_ratio is not None else 0.1
        cannot_grow = s.cache_size is not None and free + used < s.cache_size
        if ratio < want_ratio or cannot_grow:
            await self.emit.condition(
                "JuiceFSCacheLowSpace", firing=True, severity="warning", entity=f"{entity}:{cache_dir}",
                reason="BelowFreeSpaceRatio" if ratio < want_ratio else "CannotGrow",
                message=f"The filesystem of JuiceFS cache dir {cache_dir} has {free / GIB:.1f} GiB free "
                        f"({ratio:.0%})" + (f"; the cache cannot grow to {s.cache_size / GIB:.0f} GiB"
                                            if cannot_grow and s.cache_size else "") + ".",
                details=wire(JuiceFSCacheLowSpace(**(mount | {"free_space_ratio": want_ratio}), cache_dir=cache_dir,
                                                  free_bytes=free, total_bytes=total, free_ratio=round(ratio, 4))),
                suggested_action="fix_config")

    def _cache_usage(self, cache_dir: str, s: MountSettings) -> dict[str, float]:
        """From .stats block counters when the mount exposes them (no walk); else nothing is assumed."""
        stats = self._last_stats(s.mountpoint)
        if stats is not None:
            used = {"bytes": stat_value(stats, "juicefs_blockcache_bytes") or 0.0,
                    "blocks": stat_value(stats, "juicefs_blockcache_blocks") or 0.0}
            self.usage[cache_dir] = used
            return used
        return self.usage.get(cache_dir, {"blocks": 1.0})

    def _last_stats(self, mp: str) -> dict[str, float] | None:
        st = self.state.get(mp)
        return st.samples[-1][1] if st and st.samples else None

    async def _stats(self, entity: str, mp: str, s: MountSettings, mount: dict[str, Any], *, mounted: bool) -> None:
        if not mounted:
            return
        text = self.host.read_text(f"{mp}/.stats", limit=4 << 20) or self.host.read_text(f"{mp}/.jfs.stats",
                                                                                          limit=4 << 20)
        if text is None:
            return
        now = time.monotonic()
        st = self.state.setdefault(mp, MountState(first_seen=now))
        stats = parse_stats(text)
        if stats.bad_lines:
            self.emit.unparsed(f"{mp}/.stats", stats.sample)
        st.samples.append((now, stats.values))
        st.samples = [x for x in st.samples if now - x[0] <= self.config.window] or st.samples[-1:]
        if len(st.samples) < 2 or now - st.first_seen < self.config.cold_start_grace:
            return
        (t0, a), (t1, b) = st.samples[0], st.samples[-1]

        def d(name: str) -> float:
            x, y = stat_value(a, name), stat_value(b, name)
            return max(0.0, y - x) if x is not None and y is not None else 0.0

        hits, miss = d("juicefs_blockcache_hits"), d("juicefs_blockcache_miss")
        if hits + miss >= self.config.min_reads:
            ratio = hits / (hits + miss)
            if ratio < self.config.hit_ratio_min:
                await self.emit.condition(
                    "JuiceFSCacheHitRatioLow", firing=True, severity="warning", entity=entity, reason="LowHitRatio",
                    message=f"JuiceFS block cache hit ratio of {mp} is {ratio:.0%} over {t1 - t0:.0f} s "
                            f"({int(hits + miss)} block reads).",
                    details=wire(JuiceFSCacheHitRatioLow(
                        **mount, hit_ratio=round(ratio, 4), hits=hits, misses=miss,
                        hit_bytes=d("juicefs_blockcache_hit_bytes"), miss_bytes=d("juicefs_blockcache_miss_bytes"),
                        window_s=round(t1 - t0, 1))),
                    suggested_action="warmup")
        fetched, served = d(self.config.object_bytes_metric), d(self.config.read_bytes_metric)
        if served > 0 and fetched / served > self.config.read_amplification_max and (s.prefetch or 0) > 0:
            await self.emit.condition(
                "JuiceFSReadAmplification", firing=True, severity="warning", entity=entity, reason="PrefetchOnRandomIO",
                message=f"{mp} fetched {fetched / served:.1f}x more from the object store than readers got "
                        f"({fetched / (t1 - t0) / (1 << 20):.0f} MiB/s vs {served / (t1 - t0) / (1 << 20):.0f} MiB/s) "
                        f"with prefetch on: random reads want --prefetch=0.",
                details=wire(JuiceFSReadAmplification(**mount, object_bytes=fetched, read_bytes=served,
                                                      amplification=round(fetched / served, 2))),
                suggested_action="fix_config")

    def prometheus_families(self) -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        used = GaugeMetricFamily("gna_juicefs_cache_bytes", "Bytes in the JuiceFS block cache", labels=["cache_dir"])
        blocks = GaugeMetricFamily("gna_juicefs_cache_blocks", "Blocks in the JuiceFS block cache",
                                   labels=["cache_dir"])
        for cd, u in sorted(self.usage.items()):
            used.add_metric([cd], u.get("bytes", 0.0))
            blocks.add_metric([cd], u.get("blocks", 0.0))
        ratio = GaugeMetricFamily("gna_juicefs_hit_ratio", "Block cache hit ratio over the window", labels=["mount"])
        for mp, st in sorted(self.state.items()):
            if len(st.samples) >= 2:
                a, b = st.samples[0][1], st.samples[-1][1]
                h = (stat_value(b, "juicefs_blockcache_hits") or 0) - (stat_value(a, "juicefs_blockcache_hits") or 0)
                m = (stat_value(b, "juicefs_blockcache_miss") or 0) - (stat_value(a, "juicefs_blockcache_miss") or 0)
                if h + m > 0:
                    ratio.add_metric([mp], h / (h + m))
        return [used, blocks, ratio]
