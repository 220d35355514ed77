"""Badly behaved third-party collectors for the shutdown tests, installed through an entry point.

``stubborn`` swallows every cancellation (a bug real plugins have: a bare ``except:`` around an
await); ``blocking`` blocks the event loop in synchronous code once its trigger file exists.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, ClassVar

from gna_sdk import CollectorSettings


class StubbornConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    pass


class StubbornCollector:
    name: ClassVar[str] = "stubborn"
    config_type: ClassVar[type[StubbornConfig]] = StubbornConfig

    def __init__(self, config: StubbornConfig, host: Any, emit: Any) -> None:
        self.config = config

    async def run(self) -> None:
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue


class BlockingConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    trigger_file: str = ""


class BlockingCollector:
    name: ClassVar[str] = "blocking"
    config_type: ClassVar[type[BlockingConfig]] = BlockingConfig

    def __init__(self, config: BlockingConfig, host: Any, emit: Any) -> None:
        self.config = config

    async def run(self) -> None:
        if not self.config.trigger_file:
            await asyncio.Event().wait()  # installed but not asked to block
        while not Path(self.config.trigger_file).exists():
            await asyncio.sleep(0.05)
        time.sleep(3600)  # noqa: ASYNC251 - the whole event loop stops here, on purpose
