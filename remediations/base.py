"""What every remediation plugin shares: the result of an attempt, and fixed-argv command execution.

Commands are argv lists resolved once at start-up (config path, else PATH); nothing from a log
line or a message reaches a command line except values checked against an allowlist.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["executed", "already_done", "failed"]


@dataclass
class Result:
    outcome: Outcome
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


class CommandError(Exception):
    pass


def resolve_executable(name: str, configured: str = "") -> str:
    path = configured or shutil.which(name)
    if not path:
        raise CommandError(f"{name} not found (set its path in the remediation config)")
    return path


async def run_command(argv: list[str], *, timeout: float = 60.0) -> tuple[int, str, str]:
    """Run a fixed argv (never a shell); returns (rc, stdout, stderr) with output capped."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise CommandError(f"{argv[0]} timed out after {timeout:g}s") from None
    return proc.returncode or 0, out.decode("utf-8", "replace")[:4000], err.decode("utf-8", "replace")[:4000]
