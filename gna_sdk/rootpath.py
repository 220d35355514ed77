"""A host path resolved the way the host resolves it, but never outside a ``--host-root`` tree.

An absolute symlink target inside the tree (``/var/run -> /run``, ``/etc/localtime ->
/usr/share/zoneinfo/...``) names the host's file, so it starts again at the root; ``..`` never climbs
above it (path_resolution(7), as a chroot sees it). Links are counted: past ``max_links`` the answer is
ELOOP, as the kernel's own MAXSYMLINKS (40) is.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

MAXSYMLINKS = 40  # include/linux/namei.h


def resolve_in_root(root: Path, host_path: str, *, max_links: int = MAXSYMLINKS) -> Path:
    """``host_path`` (absolute or relative to the root) under ``root`` with every symlink on the way followed
    inside the root. Components need not exist (the result may name a file still to be created); a link
    that cannot be read raises OSError, too many links OSError(ELOOP)."""
    parts = [p for p in host_path.split("/") if p not in ("", ".")]
    done: list[str] = []
    links = 0
    while parts:
        name = parts.pop(0)
        if name == "..":
            if done:
                done.pop()
            continue
        here = root.joinpath(*done, name)
        if here.is_symlink():
            links += 1
            if links > max_links:
                raise OSError(errno.ELOOP, f"too many symbolic links resolving {host_path}")
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        done.append(name)
    return root.joinpath(*done)
