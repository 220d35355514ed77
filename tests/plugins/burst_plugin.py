"""A third-party collector, installed only through an entry point in a dist-info the tests write.

It emits numbered events one at a time and records each number once the agent accepted it
(durable in the spool), so a test can SIGKILL the agent and check nothing accepted was lost.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, ClassVar

from gna_sdk import CollectorSettings


class BurstConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    total: int = 2000
    accepted_file: str = ""


class BurstCollector:
    name: ClassVar[str] = "burst"
    config_type: ClassVar[type[BurstConfig]] = BurstConfig

    def __init__(self, config: BurstConfig, host: Any, emit: Any) -> None:
        self.config = config
        self.emit = emit

    async def run(self) -> None:
        path = Path(self.config.accepted_file)
        done = [int(x) for x in path.read_text().split()] if path.exists() else []
        n = done[-1] + 1 if done else 0
        with open(path, "a") as fh:
            while n < self.config.total:
                accepted = await self.emit.event("BurstEvent", severity="info", entity=f"burst:{n}", reason="Test",
                                      message=f"burst event {n}", details={"n": n, "pid": os.getpid()})
                if accepted:
                    fh.write(f"{n}\n")
                    fh.flush()
                    n += 1
        await asyncio.Event().wait()
