"""The ``details`` of the node's storage messages, as typed, bounded Structs: JuiceFS mounts and their block
caches (collectors/juicefs.py, collectors/formats/juicefs_files.py).

Every JuiceFS message carries its mount's settings (``JuiceFSMount``: what formats.juicefs_files read from the mount's
.config or the process's command line) and what its own finding adds. Each field names where its format
comes from as the collector cites it; see gna_types/gpu_details.py for how a collector builds its details
through them.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec
from msgspec import Meta

from gna_types.detail_fields import UNSET, Bytes, Count, FilePath, Paths, Ratio, Seconds, UnsetType, Word


class JuiceFSMount(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A mount's settings (collectors/formats/juicefs_files.py ``summarize_settings``)."""

    mountpoint: FilePath
    mounted: bool
    cache_dirs: Paths  # --cache-dir, as the mount sees them (volume UUID appended), or "memory"
    cache_size_bytes: Count | None  # --cache-size (MiB) or .config CacheSize (bytes since 1.1)
    free_space_ratio: Ratio | None  # --free-space-ratio
    prefetch: Count | None  # --prefetch
    version: Annotated[str, Meta(max_length=128)] | None  # the client's version
    settings_from: Word  # ".config" | "cmdline" | "config"


class JuiceFSCacheDir(JuiceFSMount, kw_only=True, omit_defaults=True):
    """``JuiceFSCacheDirMissing``: the cache dir that is absent or not writable."""

    cache_dir: FilePath


class JuiceFSCacheEphemeral(JuiceFSMount, kw_only=True, omit_defaults=True):
    """``JuiceFSCacheEphemeral``: a cache dir on tmpfs, an overlay, a kubelet emptyDir, or "memory"
    (/proc/self/mountinfo's filesystem type and mount point)."""

    filesystem: Word | UnsetType | None = UNSET
    fs_mountpoint: FilePath | UnsetType | None = UNSET
    cache_dir: FilePath
    why: Word  # memory | emptyDir | tmpfs | overlay | ...


class JuiceFSCacheCold(JuiceFSMount, kw_only=True, omit_defaults=True):
    """``JuiceFSCacheCold``: a cache dir with no blocks (juicefs_blockcache_blocks 0); a warmup's paths."""

    cache_dir: FilePath
    dataset_paths: Paths


class JuiceFSCacheSizeSuspicious(JuiceFSMount, kw_only=True, omit_defaults=True):
    """``JuiceFSCacheSizeSuspicious``: cache-size under the floor (MiB read as GiB) or under the dataset."""

    dataset_bytes: Count | None  # as configured; None: not configured


class JuiceFSCacheLowSpace(JuiceFSMount, kw_only=True, omit_defaults=True):
    """``JuiceFSCacheLowSpace``: statvfs(3) of the cache dir: f_bavail and f_blocks x f_frsize;
    ``free_space_ratio`` the one applied (JuiceFS's default 0.1 when the mount set none)."""

    cache_dir: FilePath
    free_bytes: Count
    total_bytes: Count
    free_ratio: Ratio


class JuiceFSCacheHitRatioLow(JuiceFSMount, kw_only=True, omit_defaults=True):
    """``JuiceFSCacheHitRatioLow``: the .stats counters' growth over the window (juicefs_blockcache_hits,
    _miss, _hit_bytes, _miss_bytes)."""

    hit_ratio: Ratio
    hits: Bytes
    misses: Bytes
    hit_bytes: Bytes
    miss_bytes: Bytes
    window_s: Seconds


class JuiceFSReadAmplification(JuiceFSMount, kw_only=True, omit_defaults=True):
    """``JuiceFSReadAmplification``: object-store bytes against bytes served (the configured .stats metrics)."""

    object_bytes: Bytes
    read_bytes: Bytes
    amplification: Annotated[float, Meta(ge=0)]


STORAGE_DETAILS: Final[dict[str, type[msgspec.Struct]]] = {
    "JuiceFSCacheDirMissing": JuiceFSCacheDir,
    "JuiceFSCacheEphemeral": JuiceFSCacheEphemeral,
    "JuiceFSCacheCold": JuiceFSCacheCold,
    "JuiceFSCacheSizeSuspicious": JuiceFSCacheSizeSuspicious,
    "JuiceFSCacheLowSpace": JuiceFSCacheLowSpace,
    "JuiceFSCacheHitRatioLow": JuiceFSCacheHitRatioLow,
    "JuiceFSReadAmplification": JuiceFSReadAmplification,
}
