"""The agent's own state files: written atomically with a version, read back validated, and a bad
one set aside with a message.

A state file is written by this agent (atomically), but a disk error, a hand edit or an older or
newer version can leave anything in it. A file that is not the expected version and shape is
renamed to ``<name>.bad-<epoch>`` (kept for a post-mortem, never read again) and the caller starts
fresh: one clear log line, never a crash at every start.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

set_aside_count = 0  # files set aside by this process (tests and self-metrics read it)


def write_atomic(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Readers see the old file or the new one, never a torn one (rename over it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_state(path: Path, doc: dict[str, Any], *, version: int, fsync: bool = False) -> None:
    """``doc`` stamped with ``version``, as :func:`read_state` expects it. No fsync by default: every
    state file here may lag a crash by one save (the caller's design makes a re-done step harmless)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"version": version, **doc}, separators=(",", ":")).encode(), fsync=fsync)


def read_state(path: Path, *, version: int, valid: Callable[[dict[str, Any]], bool], what: str,
               hint: str = "starting fresh") -> dict[str, Any]:
    """The file's document when it is ``version`` and ``valid``; {} when missing or set aside."""
    global set_aside_count
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, UnicodeDecodeError):
        raw = None
    try:
        ok = isinstance(raw, dict) and raw.get("version") == version and valid(raw)
    except (TypeError, ValueError, AttributeError, KeyError):
        ok = False
    if ok:
        assert isinstance(raw, dict)
        return raw
    aside = path.with_name(f"{path.name}.bad-{int(time.time())}")
    with contextlib.suppress(OSError):
        os.replace(path, aside)
    set_aside_count += 1
    log.error("state_file_invalid", what=what, path=str(path), set_aside=str(aside), hint=hint)
    return {}


def is_int(v: Any, minimum: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)
