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


def parse_stats(text: str) -> dict[str, float]:
    """``name value`` lines (names may carry Prometheus labels); junk lines are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if not name:
            continue
        try:
            v = float(value)
        except ValueError:
            continue
        if v != v or v in (float("inf"), float("-inf")):  # NaN / inf: not a counter value
            continue
        out[name.strip()] = v
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
