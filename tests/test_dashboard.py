"""The dashboard: state model, HTTP API, and a real browser (Debian chromium via Playwright)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agent.dashboard import make_app
from agent.fleet import FleetFeed, FleetState, family
from agent.message import make_message, to_dict
from agent.nats_server import NatsServerProcess
from agent.simhost import SimHost
from tests.conftest import agent_config, running_agent

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"


def _cond(node: str, type_: str, status: str, severity: str = "critical", entity: str = "gpu:0") -> dict[str, Any]:
    return to_dict(make_message(node=node, collector="gpu_devices", kind="condition", type=type_, status=status,
                                severity=severity, entity=entity, reason="R", message="m"))  # type: ignore[arg-type]


def test_state_families_spans_staleness_and_dirty_rows() -> None:
    st = FleetState()
    st.apply_state({"node": "a", "time": "2020-01-01T00:00:00Z", "heartbeat_interval": 10, "conditions": []})
    st.apply_message(_cond("b", "IBPortDown", "firing", entity="ib:mlx5_0/1"))
    st.apply_message(_cond("b", "NCCLNoGDRDMA", "firing", severity="warning", entity="nccl:b:1"))
    rows = {r["node"]: r for r in st.take_dirty()}
    assert rows["a"]["stale"] is True and rows["b"]["worst"]["IB"] == "critical"
    assert rows["b"]["worst"]["NCCL"] == "warning" and rows["b"]["active"] == 2
    assert st.take_dirty() == [], "nothing changed since"
    st.apply_message(_cond("b", "IBPortDown", "resolved", entity="ib:mlx5_0/1"))
    assert [r["node"] for r in st.take_dirty()] == ["b"]
    spans = st.nodes["b"].spans["IBPortDown|ib:mlx5_0/1"]
    assert len(spans) == 1 and spans[0][1] is not None
    svg = st.timeline_svg("b")
    assert svg.startswith("<svg") and svg.count('class="span"') == 2
    assert [r["node"] for r in st.overview(severity="warning")] == ["b"]
    assert st.overview(type_="IBPortDown") == [] and [r["node"] for r in st.overview(q="A")] == ["a"]
    assert family("GPUFellOffBus") == "GPU" and family("RoCECongestion") == "IB" and family("SpoolOverflow") == "Agent"


def test_ten_thousand_nodes_are_cheap() -> None:
    st = FleetState()
    t0 = time.perf_counter()
    for i in range(10_000):
        st.apply_state({"node": f"n{i:05d}", "time": "2026-12-02T10:00:00Z", "conditions": []})
    for i in range(0, 10_000, 7):
        st.apply_message(_cond(f"n{i:05d}", "GPUDevicesMissing", "firing"))
    st.take_dirty()
    st.apply_message(_cond("n00001", "IBPortDown", "firing", entity="ib:x"))
    t1 = time.perf_counter()
    delta = st.take_dirty()
    rows = st.overview()
    t2 = time.perf_counter()
    assert len(delta) == 1, "an update sends only the changed node"
    assert len(rows) == 10_000 and rows[0]["worst"]["GPU"] == "critical"
    assert t1 - t0 < 5 and t2 - t1 < 2, (t1 - t0, t2 - t1)


async def _dashboard(nats_url: str) -> tuple[web.AppRunner, str, FleetState, FleetFeed]:
    state = FleetState()
    feed = FleetFeed(state, [nats_url])
    await feed.start()
    runner = web.AppRunner(make_app(state))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}", state, feed


async def test_http_api_and_history_load(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    import aiohttp

    host = SimHost.gpu_node(tmp_path / "h", gpus=2)
    host.remove_dev_node("nvidia0")
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=host.root, node="web-01",
                       extra="[collectors.gpu_devices]\ninterval = 0.2\njitter = 0.0\n")
    async with running_agent(cfg) as agent:
        for _ in range(200):
            if agent.engine and agent.engine.decisions and agent.spool and not agent.spool.depth:
                break
            await asyncio.sleep(0.02)
        runner, url, _state, feed = await _dashboard(nats_server.url)  # started after: history + KV
        try:
            async with aiohttp.ClientSession() as s:
                for _ in range(100):
                    d = await (await s.get(f"{url}/api/overview")).json()
                    if d["nodes"] and d["nodes"][0]["active"]:
                        break
                    await asyncio.sleep(0.05)
                assert d["nodes"][0]["node"] == "web-01" and d["nodes"][0]["worst"]["GPU"] == "critical"
                node = await (await s.get(f"{url}/api/node/web-01")).json()
                assert node["conditions"][0]["type"] == "GPUDevicesMissing"
                assert node["actions"] and node["actions"][0]["decision"] == "dry_run"
                svg = await (await s.get(f"{url}/api/node/web-01/timeline.svg")).text()
                assert 'class="span"' in svg
                assert (await s.get(f"{url}/api/node/nope")).status == 404
                html = await (await s.get(url + "/")).text()
                assert "<title>gpu-node-agent · fleet</title>" in html
        finally:
            await runner.cleanup()
            await feed.stop()


async def test_dashboard_survives_a_nats_restart(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=2)
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=host.root, node="web-02",
                       extra="[collectors.gpu_devices]\ninterval = 0.2\njitter = 0.0\n")
    async with running_agent(cfg):
        runner, _url, state, feed = await _dashboard(nats_server.url)
        try:
            await asyncio.sleep(1.0)
            nats_server.stop()
            await asyncio.sleep(0.5)
            nats_server.start()
            await asyncio.sleep(1.5)
            host.remove_dev_node("nvidia1")
            for _ in range(200):
                if state.nodes.get("web-02") and state.nodes["web-02"].conditions:
                    break
                await asyncio.sleep(0.05)
            assert state.nodes["web-02"].conditions, "live updates resumed after the restart"
        finally:
            await runner.cleanup()
            await feed.stop()


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (.ci/run installs it)")
async def test_in_a_real_browser(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    from playwright.async_api import async_playwright

    host = SimHost.gpu_node(tmp_path / "h", gpus=8)
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=host.root, node="gpu-web-7",
                       extra="[collectors.gpu_devices]\ninterval = 3600.0\njitter = 0.0\nudev = false\n")
    async with running_agent(cfg) as agent, async_playwright() as pw:
        runner, url, _state, feed = await _dashboard(nats_server.url)
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 500})
            await page.goto(url + "/")
            cell = page.locator('tr[id="n:gpu-web-7"] td[data-family="GPU"]')
            await cell.wait_for(timeout=10_000)
            assert (await cell.text_content()) == "ok"
            await page.wait_for_function("document.getElementById('live').textContent.startsWith('live')")
            t0 = time.monotonic()
            host.remove_dev_node("nvidia2")
            await page.wait_for_function(
                "document.querySelector('tr[id=\"n:gpu-web-7\"] td[data-family=\"GPU\"]').textContent === 'critical'",
                timeout=1000)  # a condition fired by an agent appears within a second
            latency = time.monotonic() - t0
            await page.screenshot(path=str(tmp_path / "overview.png"))
            save = os.environ.get("GNA_SAVE_SCREENSHOTS") == "1"  # refresh docs/dashboard*.png on purpose only
            if save:
                shutil.copy(tmp_path / "overview.png", ROOT / "docs" / "dashboard.png")
            for _ in range(100):
                if agent.engine and agent.engine.decisions:
                    break
                await asyncio.sleep(0.02)
            node_page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await node_page.goto(url + "/node/gpu-web-7")
            await node_page.locator("tr.action").first.wait_for(timeout=5000)
            assert "dry_run" in (await node_page.locator("tr.action").first.text_content() or "")
            assert await node_page.locator("#timeline svg rect.span").count() >= 1
            await node_page.screenshot(path=str(tmp_path / "node.png"), full_page=True)
            if save:
                shutil.copy(tmp_path / "node.png", ROOT / "docs" / "dashboard-node.png")
            host.add_dev_node("nvidia2")
            await page.wait_for_function(
                "document.querySelector('tr[id=\"n:gpu-web-7\"] td[data-family=\"GPU\"]').textContent === 'ok'",
                timeout=3000)  # the resolved one clears
            (tmp_path / "latency.json").write_text(json.dumps({"fire_to_browser_s": latency}))
            assert latency < 1.0
        finally:
            await browser.close()
            await runner.cleanup()
            await feed.stop()


async def test_top_once_and_budget_cli(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    from tests.conftest import AGENT_CMD

    host = SimHost.gpu_node(tmp_path / "h", gpus=2)
    host.remove_dev_node("nvidia0")
    cfg = agent_config(tmp_path, servers=[nats_server.url], host_root=host.root, node="term-01",
                       extra="[collectors.gpu_devices]\ninterval = 0.2\njitter = 0.0\n")
    async with running_agent(cfg) as agent:
        for _ in range(200):
            if agent.spool and agent.tracker and agent.tracker.active and not agent.spool.depth:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
        proc = await asyncio.create_subprocess_exec(*AGENT_CMD, "top", "--nats", nats_server.url, "--once",
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    env={**os.environ, "COLUMNS": "200"})
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err
        text = out.decode()
        assert "term-01" in text and "critical" in text and "1 critical" in text
        proc = await asyncio.create_subprocess_exec(*AGENT_CMD, "budget", "status", "--nats", nats_server.url,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err
        status = json.loads(out)
        assert status["used"] == 0 and status["fleet_size"] == 1 and status["limit"] == 1  # 10 % of 1 node, min 1
