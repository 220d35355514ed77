"""`gpu-node-agent top`: the dashboard's fleet overview in a terminal (rich), for SSH sessions."""

from __future__ import annotations

import asyncio
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from agent.fleet import FAMILIES, FleetFeed, FleetState

STYLE = {"critical": "bold white on red", "warning": "black on yellow", "info": "black on cyan", "": "green"}


def render(state: FleetState, *, limit: int = 40, q: str = "") -> Table:
    rows = state.overview(q=q)
    crit = sum(1 for r in rows if "critical" in r["worst"].values())
    warn = sum(1 for r in rows if "warning" in r["worst"].values() and "critical" not in r["worst"].values())
    stale = sum(1 for r in rows if r["stale"])
    t = Table(title=f"gpu-node-agent · {len(state.nodes)} nodes · {crit} critical · {warn} warning · {stale} stale",
              expand=True)
    t.add_column("node")
    for fam in FAMILIES:
        t.add_column(fam, justify="center")
    t.add_column("active", justify="right")
    t.add_column("conditions")
    t.add_column("heartbeat", justify="right")
    for r in rows[:limit]:
        cells = [f"[{STYLE[r['worst'][f]]}] {r['worst'][f] or 'ok'} [/]" for f in FAMILIES]
        age = "never" if r["age_s"] is None else f"{r['age_s']:.0f}s" + (" STALE" if r["stale"] else "")
        t.add_row(r["node"], *cells, str(r["active"]), ", ".join(r["types"])[:60], age)
    if len(rows) > limit:
        t.caption = f"{len(rows) - limit} more healthy-or-lower nodes not shown"
    return t


async def run_top(servers: list[str], *, once: bool = False, duration: float | None = None, q: str = "") -> int:
    state = FleetState()
    feed = FleetFeed(state, servers)
    await feed.start()
    console = Console()
    try:
        if once:
            await asyncio.sleep(1.5)  # let the KV watch and stream history arrive
            console.print(render(state, q=q))
            return 0
        deadline = None if duration is None else time.monotonic() + duration
        with Live(render(state, q=q), console=console, refresh_per_second=2) as live:
            while deadline is None or time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                live.update(render(state, q=q))
        return 0
    finally:
        await feed.stop()
