"""`gpu-node-agent top`: the dashboard's fleet overview in a terminal (rich), for SSH sessions.

On a terminal it fits the window; piped (``top --once | grep``) it renders as wide as the content
so nothing is cut, or ``--width`` columns. The header's counts are those of the rows it lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from agent.config import NatsConfig
from fleet.state import FAMILIES, FleetFeed, FleetState
from gna_sdk import severity_rank
from gna_sdk.aio import within

STYLE = {"critical": "bold white on red", "warning": "black on yellow", "info": "black on cyan", "": "green"}
SETTLE_S = 1.5  # --once: how long the KV watch and the stream history get to arrive
PIPE_WIDTH = 1000  # piped without --width: wider than any row, so rich cuts nothing


def _worst(row: dict[str, Any]) -> int:
    return max(severity_rank(s) for s in row["worst"].values())


def header(rows: list[dict[str, Any]], total: int, q: str) -> str:
    crit = sum(1 for r in rows if _worst(r) == 3)
    warn = sum(1 for r in rows if _worst(r) == 2)
    stale = sum(1 for r in rows if r["stale"])
    scope = f"{len(rows)} of {total} nodes match {q!r}" if q else f"{total} nodes"
    return f"gpu-node-agent · {scope} · {crit} critical · {warn} warning · {stale} stale"


def render(state: FleetState, *, limit: int = 40, q: str = "", fit: bool = True) -> Table:
    """``fit``: the table fills the console's width and long cells end in an ellipsis (a terminal);
    otherwise every cell is printed whole."""
    rows = state.overview(q=q)
    t = Table(title=header(rows, len(state.nodes), q), expand=fit)
    t.add_column("node", no_wrap=True)
    for fam in FAMILIES:
        t.add_column(fam, justify="center", no_wrap=True)
    t.add_column("active", justify="right", no_wrap=True)
    t.add_column("conditions", overflow="ellipsis" if fit else "fold", no_wrap=fit)
    t.add_column("heartbeat", justify="right", no_wrap=True)
    for r in rows[:limit]:
        cells = [f"[{STYLE[r['worst'][f]]}] {r['worst'][f] or 'ok'} [/]" for f in FAMILIES]
        age = "never" if r["age_s"] is None else f"{r['age_s']:.0f}s" + (" STALE" if r["stale"] else "")
        t.add_row(r["node"], *cells, str(r["active"]), ", ".join(r["types"]), age)
    if len(rows) > limit:
        t.caption = f"{len(rows) - limit} more nodes not shown (healthiest last; --limit to show more)"
    return t


def make_console(width: int | None) -> tuple[Console, bool]:
    tty = sys.stdout.isatty()
    if width is not None:
        return Console(width=width), tty
    return (Console(), True) if tty else (Console(width=PIPE_WIDTH), False)


async def run_top(servers: list[str], *, once: bool = False, duration: float | None = None, q: str = "",
                  width: int | None = None, limit: int = 40, nats_cfg: NatsConfig | None = None) -> int:
    start = time.monotonic()
    cfg = nats_cfg or NatsConfig()
    timeout = cfg.connect_timeout if duration is None else min(cfg.connect_timeout, duration)
    state = FleetState()
    feed = FleetFeed(state, servers, nats_cfg=cfg, connect_timeout=timeout)
    await feed.start()
    console, fit = make_console(width)
    try:
        if once:
            settle = SETTLE_S if duration is None else max(0.0, min(SETTLE_S, start + duration - time.monotonic()))
            await asyncio.sleep(settle)
            console.print(render(state, q=q, limit=limit, fit=fit))
            return 0
        deadline = None if duration is None else start + duration
        with Live(render(state, q=q, limit=limit, fit=fit), console=console, refresh_per_second=2) as live:
            while deadline is None or time.monotonic() < deadline:
                await asyncio.sleep(0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic())))
                live.update(render(state, q=q, limit=limit, fit=fit))
        return 0
    finally:
        with contextlib.suppress(TimeoutError):
            await within(feed.stop(), 2.0)
