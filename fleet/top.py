"""`gpu-node-agent top`: the dashboard's fleet overview in a terminal (rich), for SSH sessions.

On a terminal it fits the window; piped (``top --once | grep``) it renders as wide as the content
so nothing is cut, or ``--width`` columns. The header's counts are those of the rows it lists.
Open incidents (the correlator's, one per job) are a small table above the nodes.
Text from the wire is shown as text: never read as rich markup, control and format characters replaced
(fleet/text.py, the dashboard's rule too).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from agent.config import NatsConfig
from fleet.state import FAMILIES, FleetFeed, FleetState
from fleet.text import clean_text
from gna_sdk import plural, severity_rank
from gna_sdk.aio import within

STYLE = {"critical": "bold white on red", "warning": "black on yellow", "info": "black on cyan", "": "green"}
SETTLE_S = 1.5  # --once: how long the KV watch and the stream history get to arrive
PIPE_WIDTH = 1000  # piped without --width: wider than any row, so rich cuts nothing
INCIDENT_ROWS = 10


def plain(value: Any) -> Text:
    """Wire text as a cell: no markup ("[red]" stays "[red]"); controls and format characters (escape
    sequences, bidi overrides, zero-width and tag characters) shown as U+FFFD (fleet/text.py)."""
    return Text(clean_text(value))


def _worst(row: dict[str, Any]) -> int:
    return max(severity_rank(s) for s in row["worst"].values())


def header(rows: list[dict[str, Any]], total: int, q: str) -> str:
    crit = sum(1 for r in rows if _worst(r) == 3)
    warn = sum(1 for r in rows if _worst(r) == 2)
    stale = sum(1 for r in rows if r["stale"])
    scope = f"{len(rows)} of {plural(total, 'node')} match {q!r}" if q else plural(total, "node")
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
        t.add_row(plain(r["node"]), *cells, str(r["active"]), plain(", ".join(r["types"])), age)
    if len(rows) > limit:
        t.caption = f"{plural(len(rows) - limit, 'more node')} not shown (healthiest last; --limit to show more)"
    return t


def _standing(r: dict[str, Any]) -> str:
    """The confidence and what it may do: "0.97 acts" (a cordon may rest on it), "0.50 shown", "contested"."""
    if r["culprit"] is None:
        return f"{r['confidence']:.2f}"
    return f"{r['confidence']:.2f} {'acts' if r.get('actionable') else 'shown'}" + (" contested" if r.get("contested")
                                                                                    else "")


def render_incidents(state: FleetState, *, limit: int = INCIDENT_ROWS, fit: bool = True) -> Table | None:
    """The open incidents, newest first: job, culprit (node, entity, kind), confidence, victims;
    None when there is none."""
    open_ = state.incidents(status="open")
    if not open_:
        return None
    t = Table(title=f"{len(open_)} open incident{'s' if len(open_) != 1 else ''}", expand=fit, title_style="bold red")
    t.add_column("job", no_wrap=True)
    t.add_column("culprit", no_wrap=True)
    t.add_column("entity", no_wrap=True)
    t.add_column("kind", no_wrap=True)
    t.add_column("conf", justify="right", no_wrap=True)
    t.add_column("victims", justify="right", no_wrap=True)
    t.add_column("reason", overflow="ellipsis" if fit else "fold", no_wrap=fit)
    for r in open_[:limit]:
        c = r["culprit"]
        kind = "" if c is None else c["kind"] + (f" rank {c['rank']}" if c.get("rank") is not None else "")
        t.add_row(plain(r.get("job_name") or r["job"]), plain(c["node"] if c else "none named"),
                  plain(c["entity"] if c else ""),
                  plain(kind), _standing(r), str(len(r["victims"])), plain(r["reason"]))
    if len(open_) > limit:
        t.caption = f"{plural(len(open_) - limit, 'more open incident')} (the dashboard's /incidents lists them all)"
    return t


def screen(state: FleetState, *, limit: int = 40, q: str = "", fit: bool = True) -> RenderableType:
    """What top shows: the open incidents, if any, above the node table."""
    nodes = render(state, q=q, limit=limit, fit=fit)
    incidents = render_incidents(state, fit=fit)
    return nodes if incidents is None else Group(incidents, nodes)


def make_console(width: int | None) -> tuple[Console, bool]:
    tty = sys.stdout.isatty()
    if width is not None:
        return Console(width=width), tty
    return (Console(), True) if tty else (Console(width=PIPE_WIDTH), False)


async def run_top(servers: list[str], *, once: bool = False, duration: float | None = None, q: str = "",
                  width: int | None = None, limit: int = 40, nats_cfg: NatsConfig | None = None,
                  stop: asyncio.Event | None = None) -> int:
    """The screen until ``duration`` or ``stop`` (the CLI's Ctrl-C and SIGTERM: the feed is closed, exit 0)."""
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
            console.print(screen(state, q=q, limit=limit, fit=fit))
            return 0
        deadline = None if duration is None else start + duration
        with Live(screen(state, q=q, limit=limit, fit=fit), console=console, refresh_per_second=2) as live:
            while (deadline is None or time.monotonic() < deadline) and not (stop and stop.is_set()):
                await asyncio.sleep(0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic())))
                live.update(screen(state, q=q, limit=limit, fit=fit))
        return 0
    finally:
        with contextlib.suppress(TimeoutError):
            await within(feed.stop(), 2.0)
