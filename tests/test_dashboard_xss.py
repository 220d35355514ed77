"""#13 D3: hostile payloads in every field the dashboard shows, published through NATS on properly
encoded subjects, rendered by the real dashboard in a real browser: nothing runs, all of it is shown
as literal text. Run once under the pages' CSP and once with CSP bypassed, so the escaping itself is
proven, not only the policy.

Each payload, if it ran, would set ``window.__xss_<field>`` and request ``/xss/<field>`` from a
recording server on loopback started here; under CSP an attempt that the policy blocked would still
show as a ``securitypolicyviolation``. A positive control at the end of each run injects one such
payload itself and shows the harness sees it (executed without CSP, a violation with it).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import nats
import pytest
from aiohttp import web

from agent.message import make_message, rfc3339, to_dict
from agent.nats_link import STREAM_SUBJECTS
from agent.nats_server import NatsServerProcess
from gna_sdk import Severity
from gna_types.subjects import action_subject, event_subject, heartbeat_subject
from tests.test_dashboard import CHROMIUM, _dashboard

OVERVIEW, NODE_A, NODE_B, SVG_A = "overview", "node A", "node B", "timeline.svg of A"


def _templates(js: str, u: str) -> list[str]:
    """Every shape of injection #13 names, and a few more; ``js`` would set the field's marker
    and request its URL, ``u`` is that URL (for payloads that need only a load, not a script)."""
    return [
        f'<img src=x onerror="{js}">',
        f'<svg onload="{js}"></svg>',
        f'"><script>{js}</script>',
        f"javascript:{js}//",
        f"x' onmouseover='{js}' data-x='",
        f"</textarea><script>{js}</script><textarea>",
        "${" + js + "}",
        "{{constructor.constructor('" + js + "')()}}",
        f'<iframe src="javascript:{js}"></iframe>',
        f'<a href="javascript:{js}" onclick="{js}">click me</a>',
        f'x" onmouseover="{js}" data-x="',
        f'<details open ontoggle="{js}"><summary>s</summary></details>',
        f'<input autofocus onfocus="{js}">',
        f"<style>@import url({u}/css);</style><link rel=stylesheet href={u}/link>",
        f'<math><mtext><table><mglyph><style><img src=x onerror="{js}">',
        f'<object data="{u}/object"></object><embed src="{u}/embed">',
    ]


class Payloads:
    """One distinct payload a field, cycling through the templates."""

    def __init__(self, recorder: str) -> None:
        self.recorder = recorder
        self.by_field: dict[str, str] = {}

    def __call__(self, field: str) -> str:
        if field not in self.by_field:
            tag = re.sub(r"\W", "_", field)
            u = f"{self.recorder}/xss/{tag}"
            js = f"window.__xss_{tag}=1;fetch(`{u}`)"
            shapes = _templates(js, u)
            self.by_field[field] = shapes[len(self.by_field) % len(shapes)]
        return self.by_field[field]


# Where each field must be visible as text (a title attribute counts: it is what hovering shows).
# Fields mapped to no page are not displayed by any view; they are injected all the same.
VISIBLE: dict[str, set[str]] = {
    "node A name": {OVERVIEW, NODE_A}, "node B name": {OVERVIEW, NODE_B},
    "hb.agent_version": {NODE_A}, "hb.time": set(), "hb.started": set(),
    "hb.cond.type": {OVERVIEW, NODE_A, SVG_A}, "hb.cond.entity": {OVERVIEW, NODE_A, SVG_A},
    "hb.cond.reason": {OVERVIEW, NODE_A}, "hb.cond.message": {OVERVIEW, NODE_A}, "hb.cond.since": {NODE_A},
    "hb.cond.collector": set(), "hb.cond.suggested_action": set(), "hb.cond.message_id": set(),
    "hb.cond.details.key": {NODE_A}, "hb.cond.details.value": {NODE_A},
    "hb.cond.details.nested.key": {NODE_A}, "hb.cond.details.nested.value": {NODE_A},
    "event.time": {NODE_A}, "event.entity": {NODE_A}, "event.message": {NODE_A}, "event.reason": set(),
    "event.details.key": set(), "event.details.value": set(),
    "cond.time": {NODE_A}, "cond.entity": {NODE_A, SVG_A}, "cond.reason": {NODE_A}, "cond.message": {NODE_A},
    "cond.details.key": {NODE_A}, "cond.details.value": {NODE_A},
    "flap.entity": {NODE_A, SVG_A}, "flap.firing.message": {NODE_A}, "flap.resolved.message": {NODE_A},
    "flap.resolved.reason": set(),
    "audit.time": {NODE_A}, "audit.first_time": {NODE_A}, "audit.reason": {NODE_A},
    "audit.trigger.type": {NODE_A}, "audit.trigger.entity": {NODE_A}, "audit.id": set(), "audit.rule": set(),
    "audit.error": set(), "audit.args": set(), "audit.result": set(), "audit.trigger.id": set(),
    "audit.trigger.status": set(), "audit.trigger.severity": set(), "audit.trigger.collector": set(),
    "audit2.time": {NODE_A}, "audit2.reason": {NODE_A},
    "B.hb.agent_version": {NODE_B}, "B.cond.entity": {OVERVIEW, NODE_B}, "B.cond.reason": {OVERVIEW, NODE_B},
    "B.cond.message": {OVERVIEW, NODE_B},
}
NESTED = {"hb.cond.details.nested.value"}  # shown as JSON inside "{key: [...]}"


def _heartbeat(node: str, p: Callable[[str], str], *, a: bool) -> dict[str, Any]:
    if not a:
        return {"node": node, "time": rfc3339(), "heartbeat_interval": 30, "agent_version": p("B.hb.agent_version"),
                "conditions": [], "conditions_complete": False}
    cond = {"collector": p("hb.cond.collector"), "type": p("hb.cond.type"), "entity": p("hb.cond.entity"),
            "severity": "critical", "since": p("hb.cond.since"), "reason": p("hb.cond.reason"),
            "message": p("hb.cond.message"), "suggested_action": p("hb.cond.suggested_action"),
            "message_id": p("hb.cond.message_id"),
            "details": {p("hb.cond.details.key"): p("hb.cond.details.value"),
                        "nested": {p("hb.cond.details.nested.key"): [p("hb.cond.details.nested.value"), 1]}}}
    # conditions_complete false: the heartbeat adds its conditions to those known from events
    return {"node": node, "time": p("hb.time"), "started": p("hb.started"), "heartbeat_interval": 30,
            "agent_version": p("hb.agent_version"), "conditions": [cond], "conditions_complete": False}


def _stream_messages(a: str, b: str, p: Callable[[str], str]) -> list[tuple[str, dict[str, Any]]]:
    def msg(node: str, collector: str, severity: Severity, *, time: str | None = None, **kw: Any) -> tuple[str, dict[str, Any]]:
        d = to_dict(make_message(node=node, collector=collector, severity=severity, **kw))
        if time is not None:
            d["time"] = time  # the wire types it as a string only: a view must not trust it to be a time
        return event_subject(node, collector, severity), d

    def audit(time: str, reason: str, decision: str) -> tuple[str, dict[str, Any]]:
        return action_subject(a, "kubernetes"), {
            "schema_version": 1, "id": p("audit.id"), "time": time, "node": a, "remediation": "kubernetes",
            "rule": p("audit.rule"), "action": "apply", "decision": decision, "reason": reason,
            "dry_run": decision == "dry_run",
            "trigger": {"id": p("audit.trigger.id"), "type": p("audit.trigger.type"),
                        "entity": p("audit.trigger.entity"), "status": p("audit.trigger.status"),
                        "severity": p("audit.trigger.severity"), "collector": p("audit.trigger.collector")},
            "args": {"taint": p("audit.args")}, "result": {"detail": p("audit.result")}, "error": p("audit.error")}

    return [
        msg(a, "kmsg_xid", "info", kind="event", type="GPUXssEvent", entity=p("event.entity"),
            reason=p("event.reason"), message=p("event.message"), time=p("event.time"),
            details={p("event.details.key"): p("event.details.value")}),
        msg(a, "infiniband", "warning", kind="condition", status="firing", type="IBXssCondition",
            entity=p("cond.entity"), reason=p("cond.reason"), message=p("cond.message"), time=p("cond.time"),
            details={p("cond.details.key"): p("cond.details.value")}),
        msg(a, "infiniband", "critical", kind="condition", status="firing", type="IBXssFlap",
            entity=p("flap.entity"), reason="PortDown", message=p("flap.firing.message")),
        msg(a, "infiniband", "critical", kind="condition", status="resolved", type="IBXssFlap",
            entity=p("flap.entity"), reason=p("flap.resolved.reason"), message=p("flap.resolved.message")),
        msg(b, "gpu_devices", "critical", kind="condition", status="firing", type="GPUXssMissing",
            entity=p("B.cond.entity"), reason=p("B.cond.reason"), message=p("B.cond.message")),
        audit(p("audit2.time"), p("audit2.reason"), "dry_run"),
        audit(p("audit.first_time"), p("audit.reason"), "skipped"),  # the same decision twice: one row, x2
        audit(p("audit.time"), p("audit.reason"), "skipped"),
    ]


class Recorder:
    """A loopback HTTP server that records every request: only an injected payload would call it."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        async def any_path(req: web.Request) -> web.Response:
            self.hits.append(req.path)
            return web.Response(status=204, headers={"Access-Control-Allow-Origin": "*"})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", any_path)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"


# Collected in every document before its own scripts run (CDP, so not subject to the page's CSP).
INIT_JS = """
window.__gna_csp = [];
document.addEventListener("securitypolicyviolation",
  e => window.__gna_csp.push(`${e.violatedDirective} ${e.blockedURI} ${e.sample}`), true);
"""

# Everything an injected handler could hang on: pointer, focus and click on every element that holds
# data from the wire (links excepted: clicking them navigates, and they are checked below instead).
FIRE_JS = """() => {
  const data = document.querySelectorAll("#rows *, #summary *, #title, #meta, #conds *, #actions *, #events *, #timeline *, #tlrange");
  for (const el of data) {
    for (const t of ["mouseover", "mouseenter", "mousemove", "mousedown", "mouseup", "focus", "focusin"])
      el.dispatchEvent(new MouseEvent(t, {bubbles: true}));
    if (el.tagName !== "A" && !el.closest("a")) el.dispatchEvent(new MouseEvent("click", {bubbles: true}));
  }
}"""

# What the page holds: markers set, attributes that are handlers, elements no view creates from
# data, links that are not to this origin, and all the text a reader can see or hover.
CHECK_JS = """() => {
  const all = [...document.querySelectorAll("*")];
  const html = document.documentElement.namespaceURI === "http://www.w3.org/1999/xhtml";
  const allowed = new Set(["TR", "TD", "A", "B", "SPAN", "DIV", "WBR",
                           "svg", "rect", "line", "text", "tspan", "g", "title"]);
  const data = html ? [...document.querySelectorAll("#rows *, #summary *, #title *, #meta *, #conds *, #actions *, #events *, #timeline *, #tlrange *")] : all;
  const inTimeline = el => !!el.closest && !!el.closest("#timeline");
  return {
    markers: Object.keys(window).filter(k => k.startsWith("__xss")),
    csp: window.__gna_csp || [],
    handlers: all.flatMap(el => [...el.attributes].filter(a => /^on/i.test(a.name)).map(a => `${el.tagName} ${a.name}`)),
    foreign: data.filter(el => !allowed.has(el.tagName) ||
                               (el.namespaceURI === "http://www.w3.org/2000/svg" && html && !inTimeline(el)))
                 .map(el => el.tagName),
    scripts: document.querySelectorAll("script").length,
    links: all.filter(el => el.tagName === "A" && (el.protocol !== location.protocol || el.host !== location.host))
              .map(el => el.getAttribute("href")),
    text: document.documentElement.textContent + "\\n" +
          all.filter(el => el.hasAttribute("title")).map(el => el.getAttribute("title")).join("\\n"),
  };
}"""


async def _publish(nats_url: str, state: Any, feed: Any, a: str, b: str, p: Payloads) -> None:
    nc = await nats.connect(nats_url)
    try:
        await feed.nc.flush()  # its heartbeat subscription is at the server before anything is sent
        for node, is_a in ((a, True), (b, False)):
            await nc.publish(heartbeat_subject(node), json.dumps(_heartbeat(node, p, a=is_a)).encode())
        await nc.flush()
        for _ in range(250):
            if a in state.nodes and b in state.nodes:
                break
            await asyncio.sleep(0.02)
        js = nc.jetstream()
        messages = _stream_messages(a, b, p)
        for subject, doc in messages:
            await js.publish(subject, json.dumps(doc).encode())
        want_events, want_audits = sum("events" in s for s, _ in messages), sum("actions" in s for s, _ in messages)
        for _ in range(250):
            if state.messages_seen >= want_events and a in state.nodes and len(state.nodes[a].actions) >= want_audits:
                break
            await asyncio.sleep(0.02)
    finally:
        await nc.close()
    assert state.rejected == {}, ("every hostile message must be accepted for the test to mean anything",
                                  state.rejections.samples)
    assert a in state.nodes and b in state.nodes, "both hostile node names were accepted from their subjects"
    assert state.messages_seen == want_events and len(state.nodes[a].actions) == want_audits


async def _republish_heartbeats(nats_url: str, a: str, b: str, p: Payloads) -> None:
    nc = await nats.connect(nats_url)
    try:
        for node, is_a in ((a, True), (b, False)):
            await nc.publish(heartbeat_subject(node), json.dumps(_heartbeat(node, p, a=is_a)).encode())
        await nc.flush()
    finally:
        await nc.close()


def _uri_component(s: str) -> str:
    return quote(s, safe="!'()*")  # what the page's encodeURIComponent() makes of it


def _expected(p: Payloads, page: str) -> dict[str, str]:
    out = {}
    for field, pages in VISIBLE.items():
        if page in pages:
            out[field] = json.dumps(p(field), ensure_ascii=False) if field in NESTED else p(field)
    return out


class Browsing:
    """One browser context (with or without CSP) and everything it saw: page errors, console lines,
    requests that left the dashboard's origin."""

    def __init__(self, url: str, mode: str, p: Payloads, recorder: Recorder) -> None:
        self.url, self.mode, self.p, self.recorder = url, mode, p, recorder
        self.page_errors: list[str] = []
        self.console: list[str] = []
        self.off_origin: list[str] = []

    def watch(self, page: Any) -> None:
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))
        page.on("console", lambda c: self.console.append(f"{c.type}: {c.text}"))
        page.on("request", lambda r: None if r.url.startswith(self.url + "/") else self.off_origin.append(r.url))

    async def probe(self, page: Any) -> None:
        """Hover what a reader hovers, then fire every handler an injected attribute could hang on."""
        from playwright.async_api import Error as PlaywrightError

        for loc in await page.locator("tbody tr, tbody td, #timeline rect.span, .ts").all():
            # The page re-renders while it is probed (the timeline's SVG is replaced on a resize or a live
            # update): the element a locator resolved to may be detached before the pointer reaches it, which
            # Playwright reports as "Element is not visible" (seen in CI). `loc` is a position (nth), so it
            # re-resolves to the redrawn element: hover again. One that stays visible and cannot be hovered
            # three times running is a real failure.
            for attempt in range(3):
                if not await loc.is_visible():
                    break
                try:
                    await loc.hover(force=True, timeout=2000)
                    break
                except PlaywrightError:
                    if attempt == 2:
                        raise
                    await page.wait_for_timeout(100)
        await page.evaluate(FIRE_JS)
        await page.wait_for_timeout(150)  # a fetch or an image load would have landed by now

    async def check(self, page: Any, where: str, *, expect_text: bool = True) -> None:
        got = await page.evaluate(CHECK_JS)
        frames = [f.url for f in page.frames if f != page.main_frame]
        problems = {
            "a payload ran (marker set)": got["markers"],
            "a payload was parsed into markup and tried (CSP violation)": got["csp"],
            "an injected handler attribute": got["handlers"],
            "elements no view creates from data": got["foreign"],
            "a link off this origin": got["links"],
            "a frame appeared": frames,
            "the recording server was called": list(self.recorder.hits),
            "the browser refused something": [c for c in self.console if "Content Security Policy" in c],
            "a script error": list(self.page_errors),
            "a request off the dashboard's origin": list(self.off_origin),
        }
        if where in (OVERVIEW, NODE_A, NODE_B):
            problems["not only the page's own script"] = [] if got["scripts"] == 1 else [got["scripts"]]
        if expect_text:
            problems["not shown as literal text"] = [
                f"{f}: {v}" for f, v in _expected(self.p, where).items() if v not in got["text"]]
        bad = {k: v for k, v in problems.items() if v}
        assert not bad, (f"{where} ({self.mode})", bad)

    async def control(self, page: Any, *, csp: bool) -> None:
        """The harness sees a payload that does run: executed without CSP, a violation under it."""
        self.recorder.hits.clear()
        u = f"{self.recorder.url}/xss/control"
        await page.evaluate("u => document.body.insertAdjacentHTML('beforeend', "
                            "`<img src=x onerror=\"window.__xss_control=1;fetch('${u}')\">`)", u)
        for _ in range(150):
            got = await page.evaluate(CHECK_JS)
            if (got["csp"] if csp else got["markers"] and self.recorder.hits):
                break
            await asyncio.sleep(0.02)
        if csp:
            assert got["markers"] == [] and self.recorder.hits == [], (got["markers"], self.recorder.hits)
            assert any(v.startswith("script-src-attr inline") for v in got["csp"]), got["csp"]
        else:
            assert got["markers"] == ["__xss_control"] and self.recorder.hits == ["/xss/control"], (
                got["markers"], self.recorder.hits)


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (.ci/run installs it)")
async def test_hostile_payloads_in_every_field_never_run(nats_server: NatsServerProcess) -> None:
    from playwright.async_api import async_playwright, expect

    recorder = Recorder()
    await recorder.start()
    p = Payloads(recorder.url)
    for field in VISIBLE:
        p(field)
    node_a, node_b = p("node A name"), p("node B name")
    assert node_a.startswith("<img") and node_b.startswith("<svg"), "both node names are markup"
    assert all(re.fullmatch(r"gna\.heartbeat\.[-_=A-Za-z0-9]+", heartbeat_subject(n)) for n in (node_a, node_b))

    nc = await nats.connect(nats_server.url)  # the stream exists before the dashboard follows it
    await nc.jetstream().add_stream(name="GNA_EVENTS", subjects=STREAM_SUBJECTS)
    await nc.close()
    runner, url, state, feed = await _dashboard(nats_server.url)
    try:
        await _publish(nats_server.url, state, feed, node_a, node_b, p)
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"])
            try:
                for bypass_csp in (False, True):
                    b = Browsing(url, "CSP bypassed" if bypass_csp else "with CSP", p, recorder)
                    ctx = await browser.new_context(bypass_csp=bypass_csp, viewport={"width": 1400, "height": 900})
                    await ctx.add_init_script(INIT_JS)
                    page = await ctx.new_page()
                    b.watch(page)

                    # The overview: rows from /api/overview, then re-rendered from the live stream.
                    await page.goto(url + "/")
                    await expect(page.locator("#rows tr")).to_have_count(2, timeout=10_000)
                    await expect(page.locator("#live")).to_have_text(re.compile(r"^live"))
                    await _republish_heartbeats(nats_server.url, node_a, node_b, p)
                    await expect(page.locator("#live")).to_have_text(re.compile(r"^live · "), timeout=5000)
                    await b.probe(page)
                    await b.check(page, OVERVIEW)
                    hrefs = await page.locator("#rows td.node a").evaluate_all("as => as.map(a => a.href)")
                    assert sorted(hrefs) == sorted(f"{url}/node/{_uri_component(n)}" for n in (node_a, node_b)), hrefs

                    # Node A's page, reached by clicking its row's link (the name is markup).
                    await page.locator("#rows tr").filter(has_text=node_a).locator("td.node a").click()
                    await page.wait_for_url(f"{url}/node/{_uri_component(node_a)}")
                    await expect(page.locator("#title")).to_have_text(node_a)
                    await expect(page.locator("tr.action")).to_have_count(2, timeout=5000)
                    await expect(page.locator("tr.action .count")).to_have_text(["\u00d72"])
                    await expect(page.locator("#timeline svg rect.span")).to_have_count(3, timeout=5000)
                    await b.probe(page)
                    await b.check(page, NODE_A)

                    await page.goto(f"{url}/node/{_uri_component(node_b)}")
                    await expect(page.locator("#title")).to_have_text(node_b)
                    await expect(page.locator("tr.cond")).to_have_count(1, timeout=5000)
                    await expect(page.locator("#meta")).to_contain_text(p("B.hb.agent_version"))
                    await expect(page.locator("#timeline svg rect.span")).to_have_count(1, timeout=5000)
                    await b.probe(page)
                    await b.check(page, NODE_B)

                    # The timeline as a document of its own: an SVG document runs scripts too.
                    await page.goto(f"{url}/api/node/{_uri_component(node_a)}/timeline.svg")
                    await page.wait_for_timeout(150)
                    await b.check(page, SVG_A)
                    # The JSON routes opened directly (/api/stream never ends its response: not a page).
                    for api in ("/api/overview", f"/api/node/{_uri_component(node_a)}", "/api/stats"):
                        resp = await page.goto(url + api)
                        assert resp is not None and resp.ok, api
                        await b.check(page, api, expect_text=False)

                    await page.goto(url + "/")
                    await expect(page.locator("#rows tr")).to_have_count(2, timeout=10_000)
                    await b.control(page, csp=not bypass_csp)
                    await ctx.close()
            finally:
                await browser.close()
    finally:
        await runner.cleanup()
        await feed.stop()
        if recorder.runner is not None:
            await recorder.runner.cleanup()
