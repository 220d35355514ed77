"""The dashboard: state model, HTTP API, and a real browser (Debian chromium via Playwright)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agent.message import make_message, rfc3339, to_dict
from agent.nats_server import NatsServerProcess
from fleet import timeline
from fleet.dashboard import make_app
from fleet.state import FleetFeed, FleetState, collapse_actions, family
from sim.host import SimHost
from tests.conftest import agent_config, running_agent

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


JFS_ENTITY = ("juicefs:/mnt/jfs:/var/lib/kubelet/pods/7d4f-demo/volumes/kubernetes.io~empty-dir/jfs-cache/"
              "9f5e8c2a-0b1d-4c6e-8f7a-3d2b1c0e9a88")
PEERMEM_MSG = ("nvidia_peermem is not loaded on a node with 8 GPUs and 8 RDMA HCAs: GPUDirect RDMA is off and NCCL "
               "stages every transfer through host memory.")
XSS = '<img src=x onerror="window.__xss=1">'


def _event(node: str, at: float, type_: str, status: str | None, entity: str, *, severity: str = "critical",
           reason: str = "R", message: str = "m", details: dict[str, Any] | None = None,
           collector: str = "infiniband") -> dict[str, Any]:
    return {"id": f"{node}-{type_}-{at}", "time": rfc3339(at), "node": node, "collector": collector,
            "kind": "condition" if status else "event", "type": type_, "status": status, "severity": severity,
            "entity": entity, "reason": reason, "message": message, "details": details or {}}


def _audit(node: str, at: float, decision: str, reason: str, type_: str, entity: str) -> dict[str, Any]:
    return {"time": rfc3339(at), "node": node, "remediation": "kubernetes", "decision": decision, "reason": reason,
            "trigger": {"type": type_, "entity": entity, "status": "firing"}}


def demo_like_fleet(now: float) -> FleetState:
    """What `gpu-node-agent demo` shows a minute in: a flapping IB port whose every flap is audited as
    a cooldown skip, nvidia_peermem unloaded, a JuiceFS cache on an emptyDir (a 130-char entity),
    a fallen-off GPU, and a node whose message tries to inject HTML."""
    st = FleetState()
    for i in range(1, 9):
        st.apply_state({"node": f"gpu-{i:02d}", "time": rfc3339(now - 0.5), "heartbeat_interval": 2,
                        "agent_version": "0.1.0", "conditions": []})
    port = "ib:mlx5_3/1"
    st.apply_action(_audit("gpu-03", now - 118, "dry_run", "would cordon Kubernetes node gpu-03, taint "
                           "gpu-node-agent/degraded=IBPortDown:NoSchedule", "IBPortDown", port))
    for k in range(8):  # down for 1.2 s, up for 1.2 s, ...
        t = now - 118 + k * 2.4
        st.apply_message(_event("gpu-03", t, "IBPortDown", "firing", port, reason="PortDown",
                                message="Port mlx5_3/1 is DOWN (Polling)."))
        if k:
            st.apply_action(_audit("gpu-03", t, "skipped", f"cooldown: acted {round(t - now + 118)}s ago "
                                   "(cooldown 600s)", "IBPortDown", port))
        st.apply_message(_event("gpu-03", t + 1.2, "IBPortDown", "resolved", port))
    st.apply_message(_event("gpu-03", now - 110, "IBPortFlapping", "firing", port, reason="LinkFlaps",
                            message="Port mlx5_3/1 went down and came back 3 times in 600 s.",
                            details={"state": "ACTIVE", "phys_state": "LinkUp", "rate": "400 Gb/sec",
                                     "flaps_in_window": 3, "window_s": 600.0}))
    st.apply_message(_event("gpu-03", now - 116, "IBErrorCountersIncreasing", "firing", port,
                            reason="CountersAboveThreshold", message="Error counters rising on mlx5_3/1: link_downed.",
                            details={"counters": [{"counter": "link_downed", "delta": 1, "window_s": 1.061}]}))
    st.apply_message(_event("gpu-02", now - 100, "KernelModuleNotLoaded", "firing", "module:nvidia_peermem",
                            reason="NotLoaded", message=PEERMEM_MSG, collector="kernel_modules",
                            details={"states": {"nvidia": "live", "nvidia_peermem": "absent"}, "gpus_on_pci": 8,
                                     "hcas": [f"mlx5_{i}" for i in range(8)], "gdr_files": []}))
    st.apply_action(_audit("gpu-02", now - 100, "dry_run", "would load kernel module nvidia_peermem",
                           "KernelModuleNotLoaded", "module:nvidia_peermem"))
    st.apply_message(_event("gpu-05", now - 125, "JuiceFSCacheEphemeral", "firing", JFS_ENTITY, severity="warning",
                            reason="emptyDir", collector="juicefs",
                            message=f"JuiceFS cache dir {JFS_ENTITY[17:]} lives on a kubelet emptyDir: it dies with "
                                    "the Pod or process, so the hit rate stays near zero.",
                            details={"mountpoint": "/mnt/jfs", "cache_dirs": [JFS_ENTITY[17:]],
                                     "cache_size_bytes": 21474836480, "cache_dir": JFS_ENTITY[17:]}))
    for type_ in ("GPUFatalXid", "GPUFellOffBus"):
        st.apply_message(_event("gpu-06", now - 90, type_, "firing", "gpu:0000:9a:00.0", reason="Xid79",
                                collector="kmsg_xid", message="GPU 0000:9a:00.0 has fallen off the bus."))
    st.apply_message(_event("gpu-07", now - 60, "NCCLSocketFallback", "firing", XSS, reason=XSS, message=XSS,
                            collector="nccl_logs", details={XSS: XSS}))
    st.apply_state({"node": XSS, "time": rfc3339(now - 0.5), "heartbeat_interval": 2, "conditions": []})
    return st


def test_worst_condition_names_the_reason() -> None:
    now = time.time()
    st = demo_like_fleet(now)
    rows = {r["node"]: r for r in st.overview()}
    w = rows["gpu-03"]["worst_condition"]
    assert (w["type"], w["entity"], w["reason"]) == ("IBPortFlapping", "ib:mlx5_3/1", "LinkFlaps"), "newest critical"
    assert rows["gpu-05"]["worst_condition"]["severity"] == "warning"
    assert rows["gpu-01"]["worst_condition"] is None
    st.apply_message(_event("gpu-05", now, "JuiceFSCacheNearlyFull", "firing", "juicefs:/mnt/jfs", severity="info"))
    assert st.row(st.nodes["gpu-05"], now)["worst_condition"]["reason"] == "emptyDir", "warning outranks a newer info"


def test_audit_trail_collapses_repeats() -> None:
    now = time.time()
    actions = demo_like_fleet(now).node_detail("gpu-03")["actions"]  # type: ignore[index]
    assert [(a["decision"], a["count"]) for a in actions] == [("skipped", 7), ("dry_run", 1)]
    assert actions[0]["first_time"] == rfc3339(now - 118 + 2.4) and actions[0]["last_time"] == rfc3339(now - 118 + 7 * 2.4)
    assert actions[0]["reason"] == "cooldown: acted 17s ago (cooldown 600s)", "the newest one speaks for the run"
    base = _audit("n", now, "skipped", "cooldown: acted 3s ago", "IBPortDown", "ib:a/1")
    other_port = {**base, "trigger": {"type": "IBPortDown", "entity": "ib:b/1"}}
    runs = collapse_actions([base, base, other_port, base, {**base, "decision": "dry_run"}, {**base, "trigger": None}])
    assert [a["count"] for a in runs] == [2, 1, 1, 1, 1], "only consecutive, identical decisions collapse"


def _svg(text: str) -> ET.Element:
    return ET.fromstring(text)  # also proves the SVG is well-formed


def _ns(tag: str) -> str:
    return "{http://www.w3.org/2000/svg}" + tag


def test_timeline_zooms_to_the_data() -> None:
    now = time.time()
    st = demo_like_fleet(now)
    root = _svg(st.timeline_svg("gpu-03", hours=6, width=1200, now=now))
    rng, gutter, right = (float(root.get(k) or 0) for k in ("data-range-s", "data-gutter", "data-plot-right"))
    assert rng == 130, "two minutes of flapping and 10 % room before them, in whole steps, not 6 hours"
    axis = root.find(_ns("line") + "[@class='axis']")
    assert axis is not None and (float(axis.get("x1") or 0), float(axis.get("x2") or 0)) == (gutter, right)
    assert right == 1200 - timeline.GAP, "the axis runs to the right edge"
    ticks = [(float(t.get("x") or 0), t.text) for t in root.iter(_ns("text")) if t.get("class") == "tick"]
    assert ticks[0] == (right, "now") and ticks[-1] == (gutter, "-2m10s"), ticks
    assert [t[1] for t in ticks][:3] == ["now", "-10s", "-20s"], "10 s steps over 2 minutes"
    labels = {"".join(t.itertext()) for t in root.iter(_ns("text")) if t.get("class") == "label"}
    assert labels == {"IBPortDown ib:mlx5_3/1", "IBPortFlapping ib:mlx5_3/1", "IBErrorCountersIncreasing ib:mlx5_3/1"}
    spans = [r for r in root.iter(_ns("rect")) if r.get("class") == "span"]
    assert len(spans) == 10 and all(float(r.get("width") or 0) >= 3 for r in spans), "a blip is still visible"
    assert all(float(r.get("x") or 0) + float(r.get("width") or 0) <= right + 0.05 for r in spans)
    titles = ["".join(r.itertext()) for r in spans]
    assert sum("still firing" in t for t in titles) == 2 and sum("(1.2 s)" in t for t in titles) == 8, titles
    assert titles[0].startswith("IBErrorCountersIncreasing ib:mlx5_3/1\ncritical from 20"), titles[0]

    old = FleetState()
    old.apply_message(_event("a", now - 2 * 3600, "GPUDevicesMissing", "firing", "gpu:0"))
    old.apply_message(_event("a", now - 10 * 3600, "IBPortDown", "firing", "ib:x/1"))
    old.apply_message(_event("a", now - 9 * 3600, "IBPortDown", "resolved", "ib:x/1"))
    old.apply_message(_event("a", now - 3600, "IBPortDown", "firing", "ib:y/1"))
    old.apply_message(_event("a", now - 3599.8, "IBPortDown", "resolved", "ib:y/1"))
    root = _svg(old.timeline_svg("a", hours=6, now=now))
    (blip,) = (r for r in root.iter(_ns("rect")) if "ib:y/1" in "".join(r.itertext()))
    assert float(blip.get("width") or 0) >= 3 and "(0.2 s)" in "".join(blip.itertext()), "a 0.2 s blip is visible"
    rng = float(root.get("data-range-s") or 0)
    assert 2.2 * 3600 <= rng <= 2.5 * 3600 and rng % 900 == 0, "2 h of data, 10 % room, whole 15-minute steps"
    assert "ib:x/1" not in ET.tostring(root, encoding="unicode"), "a span that ended before the window is not drawn"
    root = _svg(old.timeline_svg("a", hours=1, now=now))
    assert float(root.get("data-range-s") or 0) == 3600, "hours caps the window"
    fresh = FleetState()
    fresh.apply_message(_event("f", now - 5, "GPUDevicesMissing", "firing", "gpu:0"))
    assert _svg(fresh.timeline_svg("f", now=now)).get("data-range-s") == "60", "a minimum range"
    root = _svg(old.timeline_svg("nobody", hours=1, now=now))
    assert "no condition fired in the last 1 h" in "".join(root.itertext())


def test_timeline_colours_each_span_by_its_severity() -> None:
    """Issue 22 item 8: every span was drawn red, so a warning read as critical."""
    now = time.time()
    st = FleetState()
    st.apply_message(_event("n", now - 50, "NCCLNoGDRDMA", "firing", "nccl:1", severity="warning"))
    st.apply_message(_event("n", now - 45, "JuiceFSCacheCold", "firing", "juicefs:/mnt", severity="info"))
    st.apply_message(_event("n", now - 40, "IBPortDown", "firing", "ib:a/1"))
    st.apply_message(_event("n", now - 30, "NCCLNoGDRDMA", "firing", "nccl:1", severity="critical"))  # escalates
    st.apply_state({"node": "n", "time": rfc3339(now), "conditions": [
        {"collector": "nvml", "type": "GPUThrottled", "entity": "gpu:0", "severity": "warning",
         "since": rfc3339(now - 20)}]})
    root = _svg(st.timeline_svg("n", width=1000, now=now))
    spans = [(r.get("data-severity"), r.get("fill"), "".join(r.itertext())) for r in root.iter(_ns("rect"))
             if r.get("class") == "span"]
    by_label = {}
    for sev, fill, title in spans:
        by_label.setdefault(title.split("\n")[0], []).append((sev, fill, title.split("\n")[1].split(" from ")[0]))
    red, amber, grey = (timeline.SEVERITY_FILL[s] for s in ("critical", "warning", "info"))
    assert len({red, amber, grey}) == 3
    assert by_label == {
        "IBPortDown ib:a/1": [("critical", red, "critical")],
        "JuiceFSCacheCold juicefs:/mnt": [("info", grey, "info")],
        "NCCLNoGDRDMA nccl:1": [("warning", amber, "warning"), ("critical", red, "critical")],
        "GPUThrottled gpu:0": [("warning", amber, "warning")]}, by_label
    warn, crit = (r for r in root.iter(_ns("rect")) if "NCCLNoGDRDMA" in "".join(r.itertext()))
    assert warn.get("data-end") == crit.get("data-start"), "the warning span ends where the critical one begins"
    legend = root.find(_ns("g") + "[@class='legend']")
    assert legend is not None, "a legend says what the colours mean"
    assert [(r.get("data-severity"), r.get("fill")) for r in legend.iter(_ns("rect"))] == [
        ("critical", red), ("warning", amber), ("info", grey)]
    assert [t.text for t in legend.iter(_ns("text"))] == ["critical", "warning", "info"]


def test_timeline_labels_wrap_instead_of_being_cut() -> None:
    now = time.time()
    st = demo_like_fleet(now)
    for node, width in (("gpu-05", 1400), ("gpu-05", 400), ("gpu-07", 900), ("gpu-02", 600)):
        root = _svg(st.timeline_svg(node, width=width, now=now))  # XSS in gpu-07 stays text
        gutter = float(root.get("data-gutter") or 0)
        (label,) = (t for t in root.iter(_ns("text")) if t.get("class") == "label")
        cond = next(iter(st.nodes[node].conditions.values()))
        assert "".join(label.itertext()) == f"{cond['type']} {cond['entity']}", "the whole label, nothing cut"
        assert all(timeline.LABEL_X + len(ln.text or "") * timeline.CHAR_PX <= gutter for ln in label), node
        assert len(list(label)) > 1, f"{node} at {width} px wraps"
    root = _svg(st.timeline_svg("gpu-02", width=1200, now=now))
    (label,) = (t for t in root.iter(_ns("text")) if t.get("class") == "label")
    assert [ln.text for ln in label] == ["KernelModuleNotLoaded module:nvidia_peermem"], "fits: one line, widened gutter"


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
    from playwright.async_api import async_playwright, expect

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
            # locator assertions, not wait_for_function: the page's CSP forbids eval in its own world
            await expect(page.locator("#live")).to_have_text(re.compile(r"^live"))
            t0 = time.monotonic()
            host.remove_dev_node("nvidia2")
            await expect(cell).to_have_text("critical", timeout=1000)  # fired by an agent: within a second
            latency = time.monotonic() - t0
            for _ in range(100):
                if agent.engine and agent.engine.decisions:
                    break
                await asyncio.sleep(0.02)
            node_page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await node_page.goto(url + "/node/gpu-web-7")
            await node_page.locator("tr.action").first.wait_for(timeout=5000)
            assert "dry_run" in (await node_page.locator("tr.action").first.text_content() or "")
            assert await node_page.locator("#timeline svg rect.span").count() >= 1
            host.add_dev_node("nvidia2")
            await expect(cell).to_have_text("ok", timeout=3000)  # the resolved one clears
            (tmp_path / "latency.json").write_text(json.dumps({"fire_to_browser_s": latency}))
            assert latency < 1.0
        finally:
            await browser.close()
            await runner.cleanup()
            await feed.stop()


async def test_citations_stay_out_of_the_details_view() -> None:
    """Issue 22 item 8: where a threshold comes from ("NVIDIA/NVSentinel ...values.yaml @07b82dc2") is for
    developers: the node page's details never get it, at any depth; the rule and the numbers stay."""
    import aiohttp

    cite = "NVIDIA/NVSentinel distros/kubernetes/nvsentinel/charts/nic-health-monitor/values.yaml @07b82dc2"
    counter = {"counter": "symbol_error", "delta": 3, "rule": "> 120/hour", "threshold_from": "default"}
    st = FleetState()
    st.apply_message(_event("gpu-01", time.time(), "IBErrorCountersIncreasing", "firing", "ib:mlx5_0/1",
                            details={"counters": [{**counter, "citation": cite}], "citation": {"ib": cite},
                                     "source": "kmsg"}))
    runner, url = await _serve(st)
    try:
        async with aiohttp.ClientSession() as s, s.get(url + "/api/node/gpu-01") as resp:
            body = await resp.text()
    finally:
        await runner.cleanup()
    assert "NVSentinel" not in body and "citation" not in body
    (cond,) = json.loads(body)["conditions"]
    assert cond["details"] == {"counters": [counter], "source": "kmsg"}
    assert st.nodes["gpu-01"].conditions, "the state keeps the message whole (events --json prints it)"


async def test_shutdown_ends_open_streams() -> None:
    import aiohttp

    runner, url = await _serve(FleetState())
    async with aiohttp.ClientSession() as s, s.get(url + "/api/stream") as resp:
        assert await resp.content.readline() == b": connected\n"
        t0 = time.monotonic()
        await asyncio.wait_for(runner.cleanup(), 5)
        assert time.monotonic() - t0 < 2, "not held until the next keep-alive"


# Every box that would push content past its right edge, and ellipsized text whose full form is not
# on hover; wrapped timestamps (the relative and the UTC line each whole); keys of the details list that
# wrapped or drifted off their value's line.
LAYOUT_JS = """() => {
  const bad = [], de = document.documentElement;
  if (de.scrollWidth > de.clientWidth) bad.push(`document ${de.scrollWidth} > ${de.clientWidth}`);
  for (const el of document.querySelectorAll("th, td, td *, .kv > *, h2")) {
    if (!el.getClientRects().length) continue;
    if (getComputedStyle(el).textOverflow === "ellipsis") {
      const title = el.closest("[title]");
      if (!title || !title.title.includes(el.textContent)) bad.push(`ellipsis, no full title: ${el.textContent}`);
    } else if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).display !== "inline") {
      bad.push(`overflow ${el.tagName}.${el.className} ${el.scrollWidth}>${el.clientWidth}: ${el.textContent.slice(0, 50)}`);
    }
  }
  for (const el of document.querySelectorAll(".ts .rel, .ts .abs, .ts:not([data-t]), .count, .kv .k")) {
    if (new Set([...el.getClientRects()].map(r => Math.round(r.top))).size !== 1) bad.push(`wrapped: ${el.textContent}`);
  }
  for (const k of document.querySelectorAll(".kv .k")) {
    const v = k.nextElementSibling;
    if (Math.abs(k.getBoundingClientRect().top - v.getBoundingClientRect().top) > 1) bad.push(`pair split: ${k.textContent}`);
  }
  return bad;
}"""

TIMELINE_JS = """() => {
  const svg = document.querySelector("#timeline svg"), axis = svg.querySelector("line.axis");
  const box = (t) => { const b = t.getBBox(); return {text: t.textContent, x0: b.x, x1: b.x + b.width}; };
  return {width: svg.getBoundingClientRect().width, room: document.getElementById("timeline").clientWidth,
          gutter: +svg.dataset.gutter, right: +svg.dataset.plotRight,
          axis: [+axis.getAttribute("x1"), +axis.getAttribute("x2")],
          labels: [...svg.querySelectorAll("text.label")].map(box), ticks: [...svg.querySelectorAll("text.tick")].map(box),
          spans: [...svg.querySelectorAll("rect.span")].map(r => ({w: r.getBBox().width, title: r.querySelector("title").textContent}))};
}"""


STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"  # the one time format (fleet/text.py stamp, common.js stamp)


async def _serve(state: FleetState) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(make_app(state))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def _check_timeline(tl: dict[str, Any], labels: set[str]) -> None:
    assert abs(tl["width"] - tl["room"]) <= 1, "the SVG fills its section"
    assert tl["axis"] == [tl["gutter"], tl["right"]] and tl["right"] >= tl["width"] - 12, "the axis spans the plot"
    assert {lb["text"] for lb in tl["labels"]} == labels, "labels are whole"
    assert all(lb["x1"] <= tl["gutter"] - 2 for lb in tl["labels"]), ("a label runs into the plot", tl["labels"])
    ticks = sorted(tl["ticks"], key=lambda t: t["x0"])
    assert ticks[-1]["text"] == "now" and ticks[-1]["x1"] <= tl["width"] and ticks[0]["x0"] >= 0
    assert all(a["x1"] < b["x0"] for a, b in itertools.pairwise(ticks)), ("tick labels overlap", ticks)
    assert all(s["w"] >= timeline.MIN_SPAN_PX for s in tl["spans"])
    assert all(re.search(rf"\n(critical|warning|info|no severity) from {STAMP} (to {STAMP}|still firing) \(", s["title"])
               for s in tl["spans"]), ("span titles give severity, start, end and duration", tl["spans"][:2])


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (.ci/run installs it)")
async def test_layout_in_a_real_browser() -> None:
    """The demo's fleet as an on-call engineer sees it: nothing overflows or is cut, times stay on
    one line, repeats are collapsed, the worst condition's reason is on the overview, no HTML from
    the wire runs."""
    from playwright.async_api import async_playwright

    runner, url = await _serve(demo_like_fleet(time.time()))
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            await page.goto(url + "/")
            worst = page.locator('tr[id="n:gpu-03"] td.worst')
            await worst.wait_for(timeout=10_000)
            assert (await worst.text_content()) == ("IBPortFlapping ib:mlx5_3/1 · LinkFlaps: Port mlx5_3/1 went down "
                                                    "and came back 3 times in 600 s.")
            assert "NotLoaded: nvidia_peermem is not loaded" in (
                await page.locator('tr[id="n:gpu-02"] td.worst').get_attribute("title") or "")
            assert XSS in (await page.locator('tr[id="n:gpu-07"] td.worst').text_content() or ""), "shown as text"
            assert await page.evaluate("n => document.getElementById('n:' + n).querySelector('td.node').textContent",
                                       XSS) == XSS
            assert await page.evaluate(LAYOUT_JS) == []
            assert await page.evaluate("window.__xss") is None
            for width in (1400, 1024):
                await page.set_viewport_size({"width": width, "height": 900})
                for node, labels in (
                        ("gpu-03", {"IBPortDown ib:mlx5_3/1", "IBPortFlapping ib:mlx5_3/1",
                                    "IBErrorCountersIncreasing ib:mlx5_3/1"}),
                        ("gpu-02", {"KernelModuleNotLoaded module:nvidia_peermem"}),
                        ("gpu-05", {"JuiceFSCacheEphemeral " + JFS_ENTITY}),
                        ("gpu-07", {"NCCLSocketFallback " + XSS})):
                    await page.goto(f"{url}/node/{node}")
                    await page.locator("#timeline svg rect.span").first.wait_for(timeout=5000)
                    bad = await page.evaluate(LAYOUT_JS)
                    assert bad == [], (node, width, bad)
                    _check_timeline(await page.evaluate(TIMELINE_JS), labels)
                    assert await page.locator(".ts[title]").count() >= 2
            await page.goto(f"{url}/node/gpu-03")
            await page.locator("tr.action").first.wait_for(timeout=5000)
            assert await page.locator("tr.action").count() == 2, "8 audits, 7 of them the same cooldown skip"
            assert (await page.locator("tr.action .count").all_text_contents()) == ["\u00d77"]
            assert await page.locator("tr.action").first.locator(".ts").count() == 2, "last and first time"
            since = page.locator("tr.cond .ts").first
            assert re.fullmatch(rf"\d+ min ago {STAMP}", await since.text_content() or ""), "relative + UTC"
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", await since.get_attribute("title") or ""), "ISO on hover"
            assert await page.evaluate("window.__xss") is None
        finally:
            await browser.close()
            await runner.cleanup()


WRAP_JS = """() => [...document.querySelectorAll("td.worst, #incidents td.why")].map(el => ({
  node: el.closest("tr").id, text: el.textContent, ellipsis: getComputedStyle(el).textOverflow === "ellipsis",
  clipped: el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1,
  height: el.getBoundingClientRect().height}))"""


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (.ci/run installs it)")
async def test_at_1024_px_reasons_wrap_and_times_read_one_way() -> None:
    """Issue 22 item 8: at 1024 px the overview cut the worst condition and an incident's reason with an
    ellipsis; the pages printed times three ways (local "16:43:51", "Dec 5 16:43:51", ISO with a T)."""
    from playwright.async_api import async_playwright

    from fleet.text import stamp

    now = time.time()
    st = demo_like_fleet(now)
    reason = ("NCCL's RAS names 1 process on gpu-06 that died, stopped answering or never joined: rank 41 of "
              "communicator 0x5b1e0c3f9a7d2e41 (pid 4306) on GPU 0000:9a:00.0, and every other rank waits for it")
    st.apply_incident({"status": "open", "job": "0x5eed0d3e0a1b2c3d", "confidence": 0.97, "actionable": True,
                       "culprit": {"node": "gpu-06", "entity": "gpu:0000:9a:00.0", "kind": "gpu"},
                       "reason": reason, "evidence": [], "evidence_total": 0,
                       "victims": [f"gpu-0{i}" for i in (1, 2, 3)], "nodes": ["gpu-06"], "updated": now})
    runner, url = await _serve(st)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        try:
            page = await browser.new_page(viewport={"width": 1024, "height": 900})
            await page.goto(url + "/")
            await page.locator('tr[id="n:gpu-02"] td.worst').wait_for(timeout=10_000)
            await page.locator("#incrows tr.incident td.why").wait_for(timeout=10_000)
            cells = await page.evaluate(WRAP_JS)
            assert not [c for c in cells if c["ellipsis"] or c["clipped"]], "nothing is cut"
            height = {c["node"]: c["height"] for c in cells if c["node"]}
            assert height["n:gpu-02"] >= 1.8 * height["n:gpu-01"], ("the long reason wraps", height)
            why = next(c for c in cells if c["text"] == reason)
            assert why["height"] >= 1.8 * height["n:gpu-01"], ("the incident's reason wraps", why)
            assert await page.evaluate(LAYOUT_JS) == []
            seen = await page.locator('tr[id="n:gpu-01"] td.seen .ts').get_attribute("title") or ""
            assert re.fullmatch(STAMP, seen), seen
            assert await page.evaluate("t => stamp(t)", 1796460012.4) == stamp(1796460012.4) == "2026-12-05 08:40:12Z"
            await page.goto(f"{url}/node/gpu-03")
            await page.locator("#timeline svg rect.span").first.wait_for(timeout=5000)
            texts = await page.locator(".ts .abs").all_text_contents()
            assert texts and all(re.fullmatch(STAMP, t) for t in texts), texts
            assert await page.locator("#timeline svg g.legend rect").count() == 3
        finally:
            await browser.close()
            await runner.cleanup()


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


def test_a_condition_s_span_starts_when_its_source_says_it_was_logged() -> None:
    """Issue 25 (4): a finding read minutes late (a job's log, an agent restart) starts on the timeline at the
    time its line states (details.logged_at), the read time kept; a severity change starts when it was seen."""
    import datetime as dt

    from fleet.state import FleetState

    fs = FleetState()
    now = dt.datetime.now(dt.UTC)
    read, logged = (f"{(now - dt.timedelta(minutes=m)).isoformat(timespec='seconds')[:19]}Z" for m in (1, 20))
    base = {"schema_version": 1, "node": "gpu-a", "collector": "nccl_logs", "kind": "condition", "status": "firing",
            "type": "NCCLSocketFallback", "entity": "nccl:gpu-a:42", "reason": "SocketTransport", "message": "m",
            "time": read}
    fs.apply_message({**base, "id": "1", "severity": "warning", "details": {"logged_at": logged}})
    (span,) = fs.node("gpu-a").spans["NCCLSocketFallback|nccl:gpu-a:42"]
    assert span[1] is None and span[2] == "warning" and span[3] == logged
    fs.apply_message({**base, "id": "2", "severity": "critical", "details": {"logged_at": logged}})
    spans = fs.node("gpu-a").spans["NCCLSocketFallback|nccl:gpu-a:42"]
    assert len(spans) == 2 and len(spans[1]) == 3  # seen critical when read: no stated start of its own
