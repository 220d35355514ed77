"""#15 deliver 6: the correlator's incidents in the fleet views.

FleetState keeps the current record per job from the gna-incidents KV bucket, validated like every
other input (bad ones counted, never raised), bounded, open first; the dashboard serves them on
/api/incidents, on the overview and on /incidents (evidence on one timeline), live over SSE;
`top` lists the open ones above the nodes. Hostile text stays text everywhere.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import time
from typing import Any

import aiohttp
import nats
import pytest
from rich.console import Console

from agent.nats_server import NatsServerProcess
from fleet.incidents import INCIDENTS_BUCKET
from fleet.state import MAX_EVIDENCE, MAX_INCIDENT_NODES, MAX_INCIDENT_TEXT, FleetState
from fleet.top import render_incidents, screen
from gna_types.subjects import encode_token
from tests.conftest import AGENT_CMD
from tests.test_dashboard import CHROMIUM, _dashboard, _serve

JOB = "0x8201e2bd73ab4876"
XSS = '<img src=x onerror="window.__xss=1">'


def record(job: str = JOB, *, status: str = "open", updated: float | None = None, **kw: Any) -> dict[str, Any]:
    """A record as fleet/incidents.py writes it (docs/correlator.md)."""
    ev = [{"node": f"gpu-011-{i:03d}", "type": "NCCLCollectiveTimeout", "entity": f"nccl:{job}:{i}",
           "severity": "critical", "time": f"2026-12-03T07:53:{40 + i:02d}.100Z", "message": "Watchdog caught ...",
           "rank": str(i), "seq_num": 1234, "op_type": "ALLREDUCE"} for i in range(1, 4)]
    ev.insert(0, {"node": "gpu-011-000", "type": "IBPortDown", "entity": "ib:mlx5_7/1", "severity": "critical",
                  "time": "2026-12-03T07:53:40.100Z", "message": "Port mlx5_7/1 is DOWN"})
    rec = {"status": status, "job": job,
           "culprit": {"node": "gpu-011-000", "entity": "ib:mlx5_7/1", "kind": "hca_port", "rank": "4"},
           "culprits": [{"node": "gpu-011-000", "entity": "ib:mlx5_7/1", "kind": "hca_port", "rank": "4"}],
           "confidence": 0.97, "actionable": True, "contested": False, "corroboration": "own node",
           "reporters": ["gpu-011-000"], "findings": [],
           "reason": "a critical finding on a NIC port rank 4 used", "evidence": ev,
           "evidence_total": 25, "victims": [f"gpu-011-{i:03d}" for i in range(1, 12)],
           "nodes": [f"gpu-011-{i:03d}" for i in range(12)], "first_evidence": "2026-12-03T07:53:40.100Z",
           "updated": time.time() - 60 if updated is None else updated}
    return {**rec, **kw}


def _b(doc: Any) -> bytes:
    return json.dumps(doc).encode()


# -- (a) FleetState ----------------------------------------------------------------------------

def test_view_orders_open_first_then_most_recently_updated() -> None:
    st = FleetState()
    now = time.time()
    for job, status, updated in (("j-old-open", "open", now - 300), ("j-new-resolved", "resolved", now - 10),
                                 ("j-new-open", "open", now - 20), ("j-old-resolved", "resolved", now - 900)):
        assert st.apply_incident(_b(record(job, status=status, updated=updated)), key=encode_token(job))
    assert [r["job"] for r in st.incidents()] == ["j-new-open", "j-old-open", "j-new-resolved", "j-old-resolved"]
    assert [r["job"] for r in st.incidents(status="open")] == ["j-new-open", "j-old-open"]
    assert [r["job"] for r in st.incidents(status="resolved", limit=1)] == ["j-new-resolved"]
    # the incident resolves: the newer record replaces the job's, it moves down
    assert st.apply_incident(record("j-new-open", status="resolved", updated=now - 1))
    assert [r["job"] for r in st.incidents()] == ["j-old-open", "j-new-open", "j-new-resolved", "j-old-resolved"]
    # a record from the future is clamped to its receipt: it cannot pin itself on top
    st.apply_incident(record("j-future", status="resolved", updated=now + 10 * 365 * 86400))
    assert st.incidents_by_job["j-future"]["updated"] <= time.time()
    assert st.rejected == {}


def test_kept_record_is_the_validated_one() -> None:
    st = FleetState()
    rec = record(extra={"x": 1}, __proto__={"polluted": True})
    rec["evidence"][0]["unknown"] = "dropped"
    assert st.apply_incident(_b(rec), key=encode_token(JOB))
    kept = st.incidents()[0]
    assert set(kept) == {"status", "job", "job_name", "culprit", "culprits", "confidence", "actionable", "contested",
                         "corroboration", "reporters", "findings", "reason", "evidence", "evidence_total", "victims",
                         "nodes", "first_evidence", "last_evidence", "evidence_counts", "opened", "updated"}, \
        "unknown fields are not carried to the views"
    assert "unknown" not in kept["evidence"][0] and kept["evidence"][1]["rank"] == "1"
    assert kept["evidence"][1]["seq_num"] == 1234 and kept["culprit"]["rank"] == "4"
    st.apply_incident(record("j2", culprit={"node": "n", "entity": "gpu:0000:18:00.0", "kind": "gpu", "rank": 7}))
    assert st.incidents_by_job["j2"]["culprit"]["rank"] == "7"
    st.apply_incident(record("j3", culprit=None, confidence=0))
    assert st.incidents_by_job["j3"]["culprit"] is None


def test_hostile_strings_are_kept_as_text() -> None:
    st = FleetState()
    hostile = record(XSS, culprit={"node": XSS, "entity": "[bold]x[/]\x1b[31m", "kind": "\u202egpu"},
                     reason=XSS, victims=[XSS, "'; DROP TABLE--"], first_evidence=XSS)
    hostile["evidence"][0].update(node=XSS, type=XSS, entity=XSS, message=XSS, time=XSS)
    assert st.apply_incident(_b(hostile), key=encode_token(XSS))
    kept = st.incidents_by_job[XSS]
    assert kept["culprit"]["node"] == XSS and kept["evidence"][0]["time"] == XSS and kept["victims"][0] == XSS
    assert st.rejected == {}


@pytest.mark.parametrize(("data", "reason"), [
    (b"{not json", "not_json"),
    (b"\xff\xfe", "not_json"),
    (b"[1, 2]", "not_an_object"),
    (b'"open"', "not_an_object"),
    (b"[" * 100_000 + b"]" * 100_000, "not_json"),  # nesting deeper than json can parse
    (b"x" * ((1 << 20) + 1), "too_large"),
])
def test_undecodable_records_are_rejected_and_counted(data: bytes, reason: str) -> None:
    st = FleetState()
    assert not st.apply_incident(data, key=encode_token(JOB))
    assert st.rejected == {reason: 1} and st.incidents() == []
    assert st.rejections.samples[reason]["subject"] == f"$KV.{INCIDENTS_BUCKET}.{encode_token(JOB)}"


def _without(key: str) -> dict[str, Any]:
    rec = record()
    del rec[key]
    return rec


def _evidence(**kw: Any) -> dict[str, Any]:
    rec = record()
    rec["evidence"][0].update(kw)
    return rec


BAD_SHAPES: dict[str, dict[str, Any]] = {
    "no job": _without("job"),
    "no status": _without("status"),
    "empty job": record(""),
    "job a number": record(17),  # type: ignore[arg-type]
    "unknown status": record(status="maybe"),
    "culprit a string": record(culprit="gpu-011-000"),
    "culprit without node": record(culprit={"entity": "ib:mlx5_7/1", "kind": "hca_port"}),
    "culprit node a list": record(culprit={"node": ["a"], "entity": "e", "kind": "k"}),
    "culprit rank an object": record(culprit={"node": "n", "entity": "e", "kind": "k", "rank": {"x": 1}}),
    "confidence a string": record(confidence="0.97"),
    "confidence a bool": record(confidence=True),
    "confidence above 1": record(confidence=97),
    "confidence NaN": record(confidence=float("nan")),
    "reason a number": record(reason=3),
    "evidence an object": record(evidence={"node": "n"}),
    "evidence item a string": record(evidence=["IBPortDown"]),
    "evidence item without node": _evidence(node=None),
    "evidence type a number": _evidence(type=5),
    "evidence message an object": _evidence(message={"a": 1}),
    "evidence rank a float": _evidence(rank=1.5),
    "evidence rank a bool": _evidence(rank=True),
    "huge evidence list": record(evidence=[record()["evidence"][0]] * (MAX_EVIDENCE + 1),
                                 evidence_total=MAX_EVIDENCE + 1),
    "evidence_total below the list": record(evidence_total=1),
    "evidence_total a string": record(evidence_total="25"),
    "victims a string": record(victims="gpu-011-001"),
    "victims with a number": record(victims=["a", 2]),
    "huge victims list": record(victims=["v"] * (MAX_INCIDENT_NODES + 1)),
    "nodes null entries": record(nodes=[None]),
    "huge reason": record(reason="r" * (MAX_INCIDENT_TEXT + 1)),
    "huge entity": _evidence(entity="e" * (MAX_INCIDENT_TEXT + 1)),
    "first_evidence a number": record(first_evidence=1796284420),
    "updated a string": record(updated="now"),
    "updated infinite": record(updated=float("inf")),
}


@pytest.mark.parametrize("case", sorted(BAD_SHAPES))
def test_wrong_shapes_are_rejected_and_counted(case: str) -> None:
    st = FleetState()
    job = BAD_SHAPES[case].get("job")
    key = encode_token(job) if isinstance(job, str) and job else encode_token(JOB)
    assert not st.apply_incident(json.dumps(BAD_SHAPES[case]).encode(), key=key), case
    assert st.rejected == {"schema": 1}, (case, st.rejections.samples)
    assert st.incidents() == [] and not st.dirty_incidents and not st.changed.is_set()


def test_key_must_name_the_records_job() -> None:
    st = FleetState()
    assert not st.apply_incident(_b(record("job-b")), key=encode_token("job-a"))
    assert not st.apply_incident(_b(record()), key="not a token!")
    assert st.rejected == {"job_mismatch": 1, "bad_subject": 1} and st.incidents() == []
    # a bad record does not take the place of the good one the job already has
    assert st.apply_incident(_b(record()), key=encode_token(JOB))
    assert not st.apply_incident(_b(record(status="bogus")), key=encode_token(JOB))
    assert st.incidents()[0]["status"] == "open"


def test_bounded_oldest_resolved_dropped_first_and_deltas() -> None:
    st = FleetState(max_incidents=3)
    now = time.time()
    st.apply_incident(record("r1", status="resolved", updated=now - 50))
    st.apply_incident(record("o1", updated=now - 40))
    st.apply_incident(record("r2", status="resolved", updated=now - 30))
    assert [d["job"] for d in st.take_dirty_incidents()] == ["o1", "r1", "r2"]
    assert st.take_dirty_incidents() == []
    st.apply_incident(record("o2", updated=now - 20))
    assert set(st.incidents_by_job) == {"o1", "r2", "o2"} and st.incidents_dropped == 1, "the oldest resolved goes"
    delta = {d["job"]: d for d in st.take_dirty_incidents()}
    assert delta["r1"] == {"job": "r1", "removed": True} and delta["o2"]["status"] == "open"
    st.apply_incident(record("r2", status="open", updated=now - 10))  # reopened: no resolved one left
    st.apply_incident(record("o3", updated=now))
    assert set(st.incidents_by_job) == {"r2", "o2", "o3"}, "then the least recently changed open one"
    assert st.incidents_dropped == 2
    st.remove_incident("o3")
    assert "o3" not in st.incidents_by_job and {"job": "o3", "removed": True} in st.take_dirty_incidents()
    big = FleetState()
    t0 = time.perf_counter()
    for i in range(20_000):
        big.apply_incident(record(f"job-{i}", status="resolved" if i % 3 else "open", updated=now - 20_000 + i))
    assert len(big.incidents_by_job) == 5000 and big.incidents_dropped == 15_000
    assert all(r["status"] == "open" for r in big.incidents()[:5000 // 3]), "open ones outlive resolved ones"
    assert time.perf_counter() - t0 < 10


# -- top ------------------------------------------------------------------------------------------

def _text(renderable: Any, width: int = 1000) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(renderable)
    return buf.getvalue()


def test_top_lists_open_incidents_above_the_nodes() -> None:
    st = FleetState()
    st.apply_state({"node": "gpu-011-000", "time": "2026-12-03T07:53:40Z", "conditions": []})
    assert render_incidents(st) is None
    st.apply_incident(record())
    st.apply_incident(record("0xdone", status="resolved"))
    st.apply_incident(record("[bold]0xevil[/]\x1b[2J", culprit={"node": "[/]", "entity": "\x07", "kind": "k"}))
    out = _text(screen(st, fit=False))
    assert out.index("2 open incidents") < out.index("gpu-node-agent · 1 node "), "above the node table"
    line = next(ln for ln in out.splitlines() if JOB in ln)
    assert re.search(r"gpu-011-000\s*│\s*ib:mlx5_7/1\s*│\s*hca_port rank 4\s*│\s*0\.97 acts\s*│\s*11\s*│", line), line
    assert "0xdone" not in out, "resolved incidents are the dashboard's"
    assert "[bold]0xevil[/]\ufffd[2J" in out and "\x1b" not in out and "\x07" not in out, "markup and escapes stay text"
    narrow = _text(screen(st, fit=True), 100)
    assert all(len(ln) <= 100 for ln in narrow.splitlines())
    for i in range(12):
        st.apply_incident(record(f"j{i}"))
    assert "4 more open incidents" in _text(screen(st, fit=False))


# -- (b) the dashboard against a real nats-server ---------------------------------------------------

async def _put(url: str, *items: tuple[str, bytes | None]) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            kv = await js.key_value(INCIDENTS_BUCKET)
        except Exception:
            kv = await js.create_key_value(bucket=INCIDENTS_BUCKET, history=5)
        for key, value in items:
            if value is None:
                await kv.delete(key)
            else:
                await kv.put(key, value)
    finally:
        await nc.close()


async def _poll(s: aiohttp.ClientSession, url: str, ok: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        d = await (await s.get(url)).json()
        if ok(d) or time.monotonic() > deadline:
            return d
        await asyncio.sleep(0.05)


async def test_dashboard_api_serves_the_kv_bucket(nats_server: NatsServerProcess) -> None:
    runner, url, state, feed = await _dashboard(nats_server.url)  # before the bucket exists
    try:
        async with aiohttp.ClientSession() as s:
            await asyncio.sleep(0.5)
            assert (await (await s.get(url + "/api/incidents")).json()) == {"incidents": [], "total": 0, "open": 0}
            assert state.rejected == {}, "a missing bucket is waited for, not counted"
            async with s.get(url + "/api/stream") as stream:
                assert await stream.content.readline() == b": connected\n"
                rec = record()
                await _put(nats_server.url, (encode_token(JOB), _b(rec)), (encode_token("0xbad"), b"{oops"),
                           (encode_token("0xother"), _b(record("0xsomeone-else"))))
                d = await _poll(s, url + "/api/incidents", lambda d: d["total"] >= 1)
                assert d["total"] == 1 and d["open"] == 1
                got = d["incidents"][0]
                # what the record left out, the decoder fills with its defaults (issue 22's fields)
                assert got == {**rec, "updated": pytest.approx(rec["updated"]),
                               "opened": pytest.approx(rec["updated"]), "last_evidence": None, "job_name": None,
                               "evidence_counts": {"by_type": {}, "by_node": {}, "nodes": 0}}
                frame = b""
                while b"event: incidents" not in frame:
                    frame = await asyncio.wait_for(stream.content.readuntil(b"\n\n"), 10)
                assert json.loads(frame.split(b"data: ", 1)[1])[0]["job"] == JOB
            stats = await _poll(s, url + "/api/stats", lambda d: len(d["rejected"]) >= 2)
            assert stats["rejected"] == {"not_json": 1, "job_mismatch": 1} and stats["incidents"] == 1
            await _put(nats_server.url, (encode_token("0xlater"), _b(record("0xlater", status="resolved"))))
            d = await _poll(s, url + "/api/incidents", lambda d: d["total"] == 2)
            assert [r["job"] for r in d["incidents"]] == [JOB, "0xlater"], "open first"
            d = await (await s.get(url + "/api/incidents?status=resolved")).json()
            assert [r["job"] for r in d["incidents"]] == ["0xlater"]
            assert (await s.get(url + "/api/incidents?status=x")).status == 400
            assert (await s.get(url + "/api/incidents?limit=x")).status == 400
            await _put(nats_server.url, (encode_token("0xlater"), None))  # deleted from the bucket: gone
            d = await _poll(s, url + "/api/incidents", lambda d: d["total"] == 1)
            assert [r["job"] for r in d["incidents"]] == [JOB]
            for page in ("/incidents", "/"):
                resp = await s.get(url + page)
                pol = resp.headers["Content-Security-Policy"]
                assert resp.status == 200 and "unsafe" not in pol and re.search(r"script-src 'sha256-[^']+';", pol)
                assert 'id="incidents"' in await resp.text() or page == "/incidents"
    finally:
        await runner.cleanup()
        await feed.stop()


# -- (c) top --once ----------------------------------------------------------------------------------

def test_top_once_shows_the_incident(nats_server: NatsServerProcess) -> None:
    asyncio.run(_put(nats_server.url, (encode_token(JOB), _b(record())),
                     (encode_token("0xold"), _b(record("0xold", status="resolved")))))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    r = subprocess.run([*AGENT_CMD, "top", "--once", "--nats", nats_server.url], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert "1 open incident" in r.stdout and "0xold" not in r.stdout
    line = next(ln for ln in r.stdout.splitlines() if JOB in ln)
    assert "gpu-011-000" in line and "ib:mlx5_7/1" in line and re.search(r"│\s+11 │", line), line
    assert "a critical finding on a NIC port rank 4 used" in line, "piped: the reason whole, on the job's line"


# -- a real browser ------------------------------------------------------------------------------------

INIT_JS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", e => window.__csp.push(e.violatedDirective + " " + e.sample), true);
"""


def _hostile() -> dict[str, Any]:
    rec = record(XSS, culprit={"node": XSS, "entity": XSS, "kind": XSS, "rank": XSS}, reason=XSS,
                 victims=[XSS, "gpu-011-002", "gpu-011-003", "gpu-011-004"], first_evidence="2026-12-03T07:53:40.100Z")
    rec["evidence"][0].update(node=XSS, type=XSS, entity=XSS, message=XSS)
    rec["evidence"][1].update(op_type=XSS)
    return rec


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (.ci/run installs it)")
async def test_incidents_render_as_text_in_a_real_browser() -> None:
    from playwright.async_api import async_playwright, expect

    state = FleetState()
    assert state.apply_incident(_hostile())
    runner, url = await _serve(state)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        try:
            ctx = await browser.new_context(viewport={"width": 1400, "height": 900})
            await ctx.add_init_script(INIT_JS)
            page = await ctx.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda c: errors.append(c.text) if "Content Security Policy" in c.text else None)

            # the overview: a section above the nodes, while an incident is open
            await page.goto(url + "/")
            row = page.locator("#incrows tr.incident")
            await expect(row).to_have_count(1, timeout=10_000)
            assert await page.locator("#incidents").is_visible()
            assert await row.locator("td.job").text_content() == XSS
            assert await row.locator("td.culprit a").text_content() == XSS
            assert await row.locator("td.victims").text_content() == f"4: {XSS}, gpu-011-002, gpu-011-003 +1"
            assert await row.locator("td.why").get_attribute("title") == XSS
            assert await row.locator("td.culprit a").get_attribute("href") == "/node/" + _uri(XSS)
            # live: the correlator resolves it, the section goes
            await expect(page.locator("#live")).to_have_text(re.compile(r"^live"))
            state.apply_incident({**_hostile(), "status": "resolved", "updated": time.time()})
            await expect(page.locator("#incidents")).to_be_hidden(timeout=5000)
            state.apply_incident({**_hostile(), "updated": time.time()})
            await expect(row).to_have_count(1, timeout=5000)

            # the incidents page: the whole record, evidence on one timeline
            await page.goto(url + "/incidents")
            card = page.locator("section.incident")
            await expect(card).to_have_count(1, timeout=10_000)
            assert await card.locator(".job").text_content() == XSS
            assert await card.locator(".badge").text_content() == "open"
            assert XSS in (await card.locator("div.culprit").text_content() or "")
            assert await card.locator(".reason").text_content() == "reason" + XSS
            assert await card.locator(".victims a").count() == 4
            ev = card.locator("tr.ev")
            await expect(ev).to_have_count(4)
            assert await ev.locator("td.t").all_text_contents() == ["+0.00 s", "+1.00 s", "+2.00 s", "+3.00 s"]
            first = ev.first
            assert [await first.locator("td").nth(i).text_content() for i in (2, 3, 4)] == [XSS, XSS, XSS]
            assert await first.get_attribute("title") == f"published 2026-12-03 07:53:40Z · {XSS}"
            assert "op_type " + XSS in (await ev.nth(1).locator("td.ent").text_content() or "")
            xs = [(await d.bounding_box() or {"x": -1})["x"] for d in await card.locator(".dot").all()]
            assert len(xs) == 4 and xs == sorted(xs) and xs[0] < xs[-1], ("the dots sit on one time axis", xs)
            await card.locator(".job").hover()
            assert await page.evaluate("() => document.querySelectorAll('img, iframe, object, embed').length") == 0
            assert await page.evaluate("() => window.__xss") is None
            assert await page.evaluate("() => window.__csp") == [], "nothing injected even tried to run"
            assert errors == []
            await page.locator("#status").select_option("resolved")
            await expect(card).to_have_count(0)
            await expect(page.locator("#empty")).to_be_visible()
        finally:
            await browser.close()
            await runner.cleanup()


def _uri(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="!'()*")
