"""Extract a ttar archive (Prometheus procfs' fixture format) into a directory.

Records: ``Path: p`` + ``Lines: N`` + N lines (a last line ending in ``EOF`` has no newline),
``Directory: p``, ``SymlinkTo: target`` after a Path; then ``Mode: octal``; separated by
``# ttar - - -`` lines.
"""

from __future__ import annotations

import os
from pathlib import Path


def extract(archive: Path, dest: Path, *, strip: str = "fixtures/") -> Path:
    lines = archive.read_text().split("\n")
    i = 0
    path: str | None = None
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("# ttar") or not line or line.startswith("# Archive"):
            continue
        if line.startswith("Directory: "):
            path = line[len("Directory: "):].removeprefix(strip)
            (dest / path).mkdir(parents=True, exist_ok=True)
        elif line.startswith("Path: "):
            path = line[len("Path: "):].removeprefix(strip)
        elif line.startswith("Lines: ") and path is not None:
            n = int(line.split()[1])
            body = lines[i : i + n]
            i += n
            text = "\n".join(body) + "\n" if n else ""
            if text.endswith("EOF\n"):
                text = text[: -len("EOF\n")]
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        elif line.startswith("SymlinkTo: ") and path is not None:
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(line[len("SymlinkTo: "):], target)
        elif line.startswith("Mode: ") and path is not None:
            p = dest / path
            if p.exists() and not p.is_symlink():
                p.chmod(int(line.split()[1], 8))
    return dest
