"""structlog set-up: JSON lines when stderr is not a TTY (journald, files), console otherwise."""

from __future__ import annotations

import io
import logging
import sys
from typing import TextIO, cast

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class HeldLog(io.TextIOBase):
    """Log lines held back until ``release()`` writes them to ``stream`` (and every later one goes straight
    there), or ``drop()`` forgets them. A central service logs while it connects; when NATS cannot be reached at
    start, its one line on stderr (exit 69) is all an operator is promised, so what it logged is dropped."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self.held: list[str] | None = []

    def write(self, text: str) -> int:
        if self.held is None:
            return self.stream.write(text)
        self.held.append(text)
        return len(text)

    def flush(self) -> None:
        if self.held is None:
            self.stream.flush()

    def release(self) -> None:
        if self.held is not None:
            held, self.held = self.held, None
            self.stream.write("".join(held))
            self.stream.flush()

    def drop(self) -> None:
        self.held = None


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | HeldLog | None = None) -> None:
    """structlog for this process; its lines go to ``stream`` (default: stderr)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(cast(TextIO, stream or sys.stderr)),  # it only writes, flushes
        cache_logger_on_first_use=False,
    )
