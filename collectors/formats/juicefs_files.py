"""Parsers for JuiceFS on a node: /proc/mounts lines, <mount>/.stats, .config, `juicefs mount` argv."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

MIB = 1 << 20
GIB = 1 << 30
_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape_mount_field(s: str) -> str:
    """/proc/mounts escapes space, tab, newline and backslash as \\040 \\011 \\012 \\134."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), s)


@dataclass(frozen=True)
class MountEntry:
    source: str
    mountpoint: str
    fstype: str
    options: str


def parse_mounts(text: str) -> list[MountEntry]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        out.append(MountEntry(unescape_mount_field(parts[0]), unescape_mount_field(parts[1]), parts[2], parts[3]))
    return out


# Enterprise Edition `.stats` is `key: value` lines with dotted keys (as read by fluid-cloudnative/fluid
# pkg/ddc/juicefs/const.go and its EE test dumps); the ones the collector uses map onto the
# Community Edition's names. get_bytes/read_bytes are object-store downloads and FUSE reads by their
# agreement with object.get and fuse_ops.read in those dumps (no public EE document defines them).
EE_NAMES = {
    "blockcache.hits": "juicefs_blockcache_hits", "blockcache.miss": "juicefs_blockcache_miss",
    "blockcache.hitBytes": "juicefs_blockcache_hit_bytes", "blockcache.missBytes": "juicefs_blockcache_miss_bytes",
    "blockcache.bytes": "juicefs_blockcache_bytes", "blockcache.blocks": "juicefs_blockcache_blocks",
    "get_bytes": "juicefs_object_request_data_bytes_GET", "put_bytes": "juicefs_object_request_data_bytes_PUT",
    "read_bytes": "juicefs_fuse_read_size_bytes_sum", "write_bytes": "juicefs_fuse_written_size_bytes_sum",
}
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class Stats:
    """A `.stats` file: values under Community Edition names, and what could not be read."""

    values: dict[str, float] = field(default_factory=dict)
    edition: str = ""  # "ce" (`name value`), "ee" (`key: value`), "" when nothing was read
    bad_lines: int = 0
    sample: str = ""  # the first line that was neither form


def _flatten(name: str) -> str:
    """CE folds a metric's method into its name in `.stats` (pkg/vfs/internal.go since v1.2:
    `juicefs_object_request_data_bytes_GET`); a Prometheus-labelled line is folded the same way."""
    base, brace, labels = name.partition("{")
    if not brace:
        return name
    method = dict(_LABEL.findall(labels)).get("method")
    return f"{base}_{method}" if method else base


def parse_stats(text: str) -> Stats:
    """Both editions' `.stats`. Duplicate names are summed (CE v1.2+ drops the storage_class label,
    so two `_GET` lines can appear, as `juicefs stats` also sums them); NaN/inf are no counter values."""
    out = Stats()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if ": " in line and " " not in line.split(": ", 1)[0]:
            key, _, value = line.partition(": ")
            name, edition = EE_NAMES.get(key.strip(), key.strip()), "ee"
        else:
            name, _, value = line.rpartition(" ")
            name, edition = _flatten(name.strip()), "ce"
        try:
            v = float(value)
        except ValueError:
            v = float("nan")
        if not name or v != v or v in (float("inf"), float("-inf")):
            if not (edition == "ee" and value.strip().startswith("[")):  # EE lists (`meta.usec_ping: [1799]`)
                out.bad_lines += 1
                out.sample = out.sample or line[:200]
            continue
        out.edition = out.edition or edition
        out.values[name] = out.values.get(name, 0.0) + v
    return out


def parse_size(text: str, *, bare_unit: int = MIB) -> int | None:
    """JuiceFS sizes: a bare number is MiB (``--cache-size=100`` is 100 MiB); K/M/G/T(i) suffixes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]?)(i?B?)?\s*", text, re.IGNORECASE)
    if not m:
        return None
    num, unit = float(m.group(1)), m.group(2).upper()
    if not unit:
        return int(num * bare_unit)
    return int(num * (1 << (10 * "KMGTP".index(unit) + 10)))


@dataclass
class MountSettings:
    mountpoint: str
    cache_dirs: list[str] = field(default_factory=list)  # as the mount sees them (volume UUID appended)
    cache_size: int | None = None  # bytes
    free_space_ratio: float | None = None
    prefetch: int | None = None
    buffer_size: int | None = None
    version: str = ""
    source: str = ""  # ".config" or "cmdline"
    uuid: str = ""


def parse_config(text: str, mountpoint: str) -> MountSettings | None:
    """<mountpoint>/.config JSON (root only). CacheSize is bytes since 1.1, MiB in 1.0.x."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    raw_chunk = data.get("Chunk")
    chunk: dict[str, Any] = raw_chunk if isinstance(raw_chunk, dict) else {}
    version = str(data.get("Version", ""))
    s = MountSettings(mountpoint, source=".config", version=version)
    cache_dir = chunk.get("CacheDir")
    if isinstance(cache_dir, str) and cache_dir:
        s.cache_dirs = [d for d in cache_dir.split(":") if d]
    size = chunk.get("CacheSize")
    if isinstance(size, (int, float)) and size >= 0:
        legacy = re.match(r"1\.0\.", version) is not None
        s.cache_size = int(size) * (MIB if legacy else 1)
    for key, attr in (("FreeSpace", "free_space_ratio"), ("Prefetch", "prefetch"), ("BufferSize", "buffer_size")):
        v = chunk.get(key)
        if isinstance(v, (int, float)):
            setattr(s, attr, float(v) if attr == "free_space_ratio" else int(v))
    raw_fmt = data.get("Format")
    s.uuid = str(raw_fmt.get("UUID", "")) if isinstance(raw_fmt, dict) else ""
    return s


def parse_mount_argv(argv: list[str]) -> MountSettings | None:
    """`juicefs mount [flags] META-URL MOUNTPOINT [flags]` -> settings (defaults of the community edition)."""
    if len(argv) < 2 or not argv[0].rsplit("/", 1)[-1].startswith("juicefs") or "mount" not in argv[1:3]:
        return None
    flags: dict[str, str] = {}
    positional: list[str] = []
    i = argv.index("mount") + 1
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") or (a.startswith("-") and len(a) == 2):
            key, eq, val = a.lstrip("-").partition("=")
            if eq:
                flags[key] = val
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-") and key in VALUE_FLAGS:
                flags[key] = argv[i + 1]
                i += 1
            else:
                flags[key] = "true"
        else:
            positional.append(a)
        i += 1
    if len(positional) < 2:
        return None
    s = MountSettings(positional[1], source="cmdline")
    s.cache_dirs = [d for d in flags.get("cache-dir", "/var/jfsCache").split(":") if d]
    s.cache_size = parse_size(flags.get("cache-size", "102400"))
    try:
        s.free_space_ratio = float(flags.get("free-space-ratio", "0.1"))
        s.prefetch = int(flags.get("prefetch", "1"))
    except ValueError:
        pass
    s.buffer_size = parse_size(flags.get("buffer-size", "300"))
    return s


VALUE_FLAGS = {"cache-dir", "cache-size", "free-space-ratio", "prefetch", "buffer-size", "o", "log", "metrics",
               "cache-mode", "max-uploads", "upload-limit", "download-limit", "backup-meta", "heartbeat",
               "attr-cache", "entry-cache", "dir-entry-cache", "open-cache", "subdir", "bucket", "storage",
               "cache-partial-only", "verify-cache-checksum", "cache-eviction", "cache-scan-interval"}


def redact_meta_url(url: str) -> str:
    """redis://user:secret@host:6379/1 -> redis://user:***@host:6379/1 (never log a password)."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def stat_value(stats: dict[str, float], name: str) -> float | None:
    if name in stats:
        return stats[name]
    total = [v for k, v in stats.items() if k.split("{", 1)[0] == name]
    return sum(total) if total else None


def summarize_settings(s: MountSettings) -> dict[str, Any]:
    return {"cache_dirs": s.cache_dirs, "cache_size_bytes": s.cache_size, "free_space_ratio": s.free_space_ratio,
            "prefetch": s.prefetch, "version": s.version or None, "settings_from": s.source}
