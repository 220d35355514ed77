"""`top`: full width when piped (nothing cut), --width, and a header whose counts are the rows shown."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import time

import nats
from rich.console import Console

from agent.message import rfc3339
from agent.nats_server import NatsServerProcess
from fleet.state import FleetState
from fleet.top import PIPE_WIDTH, header, render
from tests.conftest import AGENT_CMD

LONG_TYPES = ["GPUDevicesMissing", "IBPortDown", "IBPortFlapping", "KernelModuleNotLoaded", "NCCLSocketFallback",
              "JuiceFSCacheEphemeral"]


def _state(name: str, conds: list[tuple[str, str]]) -> dict[str, object]:
    return {"node": name, "time": rfc3339(), "heartbeat_interval": 10, "agent_version": "0.1.0",
            "conditions": [{"collector": "c", "type": t, "entity": f"e:{i}", "severity": sev, "reason": "R",
                            "message": "m", "since": rfc3339()} for i, (t, sev) in enumerate(conds)]}


def _fleet() -> FleetState:
    st = FleetState()
    st.apply_state(_state("gpu-01", [(t, "critical") for t in LONG_TYPES]))
    st.apply_state(_state("gpu-02", [("IBPortDown", "warning")]))
    st.apply_state(_state("cpu-01", []))
    st.apply_state(_state("gpu-03", []))
    return st


def _text(table: object, width: int) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(table)
    return buf.getvalue()


def test_piped_render_cuts_nothing() -> None:
    out = _text(render(_fleet(), fit=False), PIPE_WIDTH)
    assert ", ".join(sorted(LONG_TYPES)) in out, "the conditions column must be whole when piped"
    assert "…" not in out
    # and it is only as wide as its content, not PIPE_WIDTH columns of padding
    assert max(len(line.rstrip()) for line in out.splitlines()) < 250


def test_terminal_render_fits_the_width() -> None:
    out = _text(render(_fleet(), fit=True), 100)
    assert all(len(line) <= 100 for line in out.splitlines())
    assert "…" in out  # the long conditions cell ends in an ellipsis instead of wrapping the table


def test_header_counts_are_those_of_the_rows_shown() -> None:
    st = _fleet()
    everything = header(st.overview(), len(st.nodes), "")
    assert everything == "gpu-node-agent · 4 nodes · 1 critical · 1 warning · 0 stale"
    searched = header(st.overview(q="gpu-0"), len(st.nodes), "gpu-0")
    assert searched == "gpu-node-agent · 3 of 4 nodes match 'gpu-0' · 1 critical · 1 warning · 0 stale"
    assert header(st.overview(q="cpu"), len(st.nodes), "cpu").endswith("1 of 4 nodes match 'cpu' · 0 critical · "
                                                                        "0 warning · 0 stale")



def test_one_node_is_one_node_not_1_nodes() -> None:
    """Issue 22 item 8: counts of one read in the singular."""
    st = _fleet()
    assert header(st.overview(q="gpu-01"), 1, "").startswith("gpu-node-agent · 1 node · ")
    out = _text(render(st, fit=False, limit=3), PIPE_WIDTH)
    assert "1 more node not shown" in out and "1 more nodes" not in out


def test_limit_caption_says_how_many_are_hidden() -> None:
    out = _text(render(_fleet(), fit=False, limit=2), PIPE_WIDTH)
    assert "2 more nodes not shown" in out and "gpu-01" in out and "gpu-02" in out and "gpu-03" not in out


async def _publish_states(url: str) -> None:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().create_key_value(bucket="gna-nodes", history=1)
        await kv.put("gpu-01", json.dumps(_state("gpu-01", [(t, "critical") for t in LONG_TYPES])).encode())
        await kv.put("gpu-02", json.dumps(_state("gpu-02", [("IBPortDown", "warning")])).encode())
    finally:
        await nc.close()


def test_top_once_piped_and_with_width(nats_server: NatsServerProcess) -> None:
    asyncio.run(_publish_states(nats_server.url))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    t0 = time.monotonic()
    r = subprocess.run([*AGENT_CMD, "top", "--once", "--nats", nats_server.url], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 15
    assert ", ".join(sorted(LONG_TYPES)) in r.stdout and "2 nodes · 1 critical · 1 warning" in r.stdout
    w = subprocess.run([*AGENT_CMD, "top", "--once", "--width", "90", "--search", "gpu-02", "--nats",
                        nats_server.url], capture_output=True, text=True, timeout=60, env=env)
    assert w.returncode == 0, w.stderr
    assert all(len(line) <= 90 for line in w.stdout.splitlines())
    assert "1 of 2 nodes match 'gpu-02'" in w.stdout and "gpu-01" not in w.stdout
