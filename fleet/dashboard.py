"""`gpu-node-agent dashboard`: the fleet in a browser (aiohttp; no front-end build step).

Overview (nodes x condition families, worst severity, last heartbeat, stale flagged), filters,
search, the worst condition's reason per node, node pages with active conditions, recent events,
the remediation audit trail (repeats collapsed) and an SVG timeline of firing spans. Live over
SSE: only changed rows are sent, so 10,000 nodes stay cheap. Incidents (the correlator's, one per
job): open ones at the top of the overview, all of them on /incidents with the evidence on one
timeline; their changes travel on the same stream as ``event: incidents`` frames.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import sys
import time
from importlib.resources import files
from typing import Any

import structlog
from aiohttp import web

from agent import natsclient
from agent.config import NatsConfig
from fleet.state import FleetFeed, FleetState
from fleet.text import clean_markup, clean_tree

log = structlog.get_logger(__name__)

SSE_BATCH_S = 0.25
# details keys a view never renders, at any depth: "citation" is where a rule comes from (a repository file at
# a commit, collectors/nvml.py and infiniband.py), for developers; `gpu-node-agent events` still prints it
VIEW_HIDDEN = frozenset({"citation"})
EX_OSERR = 71  # sysexits: cannot listen on the requested address


INCLUDE = "// @include common.js"  # where a page takes the shared script, inside its own inline block


def _page(name: str) -> str:
    static = files("fleet") / "static"
    page = static.joinpath(name).read_text(encoding="utf-8")
    return page.replace(INCLUDE, static.joinpath("common.js").read_text(encoding="utf-8"))


def csp(page: str) -> str:
    """A strict Content-Security-Policy for one page: only its own inline <script> and <style> blocks
    run (by hash), nothing injected into the DOM can execute (no inline handlers, no eval, no other
    origin), the page cannot be framed."""
    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.S)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'"
                        for b in blocks)

    return (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
            "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _json(data: Any) -> web.Response:
    """Every JSON body a page reads: each string in it (keys too) cleaned of controls and format characters
    before it leaves (fleet/text.py); the SSE frames and the timeline SVG go through the same rule."""
    return web.json_response(clean_tree(data))


def for_view(value: Any) -> Any:
    """A JSON-shaped value without the keys in VIEW_HIDDEN, at any depth."""
    if isinstance(value, dict):
        return {k: for_view(v) for k, v in value.items() if k not in VIEW_HIDDEN}
    if isinstance(value, list):
        return [for_view(v) for v in value]
    return value


def make_app(state: FleetState, feed: FleetFeed | None = None) -> web.Application:
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    from fleet.metrics import DashboardMetrics

    app = web.Application()
    index, node_page, incidents_page = _page("dashboard.html"), _page("node.html"), _page("incidents.html")
    headers = {p: {"Content-Security-Policy": csp(p), "X-Content-Type-Options": "nosniff",
                   "Referrer-Policy": "no-referrer"} for p in (index, node_page, incidents_page)}

    async def overview_html(_req: web.Request) -> web.Response:
        return web.Response(text=index, content_type="text/html", headers=headers[index])

    async def node_html(_req: web.Request) -> web.Response:
        return web.Response(text=node_page, content_type="text/html", headers=headers[node_page])

    async def incidents_html(_req: web.Request) -> web.Response:
        return web.Response(text=incidents_page, content_type="text/html", headers=headers[incidents_page])

    async def api_incidents(req: web.Request) -> web.Response:
        status = req.query.get("status", "")
        if status not in ("", "open", "resolved"):
            raise web.HTTPBadRequest(text="status is open or resolved")
        try:
            limit = int(req.query.get("limit", "500"))
        except ValueError:
            raise web.HTTPBadRequest(text="limit is a number") from None
        recs = state.incidents(status=status)
        job = req.query.get("job")
        if job is not None:
            recs = [r for r in recs if r["job"] == job]
        return _json({"incidents": recs[:max(0, min(limit, 5000))], "total": len(recs),
                      "open": sum(1 for r in state.incidents_by_job.values() if r["status"] == "open")})

    async def api_overview(req: web.Request) -> web.Response:
        q = req.query
        rows = state.overview(severity=q.get("severity", ""), collector=q.get("collector", ""),
                              type_=q.get("type", ""), q=q.get("q", ""))
        return _json({"nodes": rows, "total": len(state.nodes)})

    async def api_node(req: web.Request) -> web.Response:
        detail = state.node_detail(req.match_info["name"])
        if detail is None:
            raise web.HTTPNotFound(text="unknown node")
        return _json({**detail, "conditions": [{**c, "details": for_view(c.get("details"))}
                                               for c in detail["conditions"]]})

    async def api_timeline(req: web.Request) -> web.Response:
        try:  # hours caps the window (the plot zooms to the data inside it); width is the page's, in px
            hours = min(48.0, max(0.1, float(req.query.get("hours", "6"))))
            width = int(min(4000.0, max(400.0, float(req.query.get("width", "900")))))
        except ValueError:
            raise web.HTTPBadRequest(text="hours and width are numbers") from None
        return web.Response(text=clean_markup(state.timeline_svg(req.match_info["name"], hours=hours, width=width)),
                            content_type="image/svg+xml")

    async def api_stats(_req: web.Request) -> web.Response:
        lags = sorted(state.last_message_lag)

        def pct(p: float) -> float | None:
            return round(lags[min(len(lags) - 1, int(p / 100 * len(lags)))], 4) if lags else None

        return _json({"nodes": len(state.nodes), "messages": state.messages_seen,
                      "rejected": state.rejected,
                      "rejected_samples": state.rejections.samples,
                      "lag_p50_s": pct(50), "lag_p99_s": pct(99),
                      "lag_max_s": lags[-1] if lags else None,
                      "incidents": len(state.incidents_by_job),
                      "incidents_dropped": state.incidents_dropped,
                      "subscribers": len(subscribers)})

    async def api_stream(req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(req)
        sub = Subscriber()
        subscribers.add(sub)
        try:
            await resp.write(b": connected\n\n")
            while True:
                try:
                    item = await asyncio.wait_for(sub.queue.get(), 15)
                    if item is None:
                        break
                    event, rows = item  # a named event: pages that only know node rows never see it
                    head = b"event: " + event.encode() + b"\n" if event != "message" else b""
                    await resp.write(head + b"data: " + json.dumps(clean_tree(rows), separators=(",", ":")).encode()
                                     + b"\n\n")
                except TimeoutError:
                    await resp.write(b": keep-alive\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            subscribers.discard(sub)
        return resp

    subscribers: set[Subscriber] = set()
    metrics = DashboardMetrics(state, feed, subscribers=lambda: len(subscribers))

    async def prometheus(_req: web.Request) -> web.Response:
        """Counts only (fleet/metrics.py): no node or job is named here."""
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def fan_out(_app: web.Application) -> Any:
        async def loop() -> None:
            while True:
                await state.changed.wait()
                await asyncio.sleep(SSE_BATCH_S)  # batch: a burst of 2,000 events/s is a few frames
                rows = state.take_dirty()
                incidents = state.take_dirty_incidents()
                for sub in list(subscribers):
                    if rows or not incidents:
                        sub.offer(rows)
                    if incidents:
                        sub.offer(incidents, event="incidents")

        task = asyncio.get_running_loop().create_task(loop())
        yield
        task.cancel()

    async def close_streams(_app: web.Application) -> None:
        # A stream whose browser went away is only noticed at its next write: without this,
        # shutting down waited for the next keep-alive (up to 15 s).
        for sub in list(subscribers):
            sub.close()

    app.cleanup_ctx.append(fan_out)
    app.on_shutdown.append(close_streams)
    app.router.add_get("/", overview_html)
    app.router.add_get("/node/{name}", node_html)
    app.router.add_get("/incidents", incidents_html)
    app.router.add_get("/api/incidents", api_incidents)
    app.router.add_get("/api/overview", api_overview)
    app.router.add_get("/api/node/{name}", api_node)
    app.router.add_get("/api/node/{name}/timeline.svg", api_timeline)
    app.router.add_get("/api/stream", api_stream)
    app.router.add_get("/api/stats", api_stats)
    app.router.add_get("/metrics", prometheus)
    return app


class Subscriber:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, list[dict[str, Any]]] | None] = asyncio.Queue(maxsize=64)

    def offer(self, rows: list[dict[str, Any]] | None, *, event: str = "message") -> None:  # None: the stream ends
        if self.queue.full():  # a slow browser: it gets the next batch; a reload fetches everything
            self.queue.get_nowait()
        self.queue.put_nowait(None if rows is None else (event, rows))

    def close(self) -> None:
        self.offer(None)


async def serve(servers: list[str], host: str, port: int, *, duration: float | None = None,
                ready_file: str | None = None, history_s: float = 6 * 3600,
                nats_cfg: NatsConfig | None = None) -> int:
    """Serve until SIGTERM/SIGINT or ``duration`` seconds from the call (connecting included): 0; or until
    its NATS connection closed for good: ``EX_TEMPFAIL`` (75, agent/natsclient.py), so it is restarted."""
    start = time.monotonic()
    cfg = nats_cfg or NatsConfig()
    watch = natsclient.watching()  # the feed's connection registers with it: closed for good -> EX_TEMPFAIL
    state = FleetState(history_s=history_s)
    feed = FleetFeed(state, servers, nats_cfg=cfg,
                     connect_timeout=cfg.connect_timeout if duration is None else min(cfg.connect_timeout, duration))
    await feed.start()
    runner = web.AppRunner(make_app(state, feed), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        print(f"gpu-node-agent: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        await runner.cleanup()
        await feed.stop()
        return EX_OSERR
    bound = runner.addresses[0][1] if runner.addresses else port
    url = f"http://{host}:{bound}/"
    log.info("dashboard_listening", url=url, nodes=len(state.nodes))
    print(f"dashboard: {url}", flush=True)
    if ready_file:
        with open(ready_file, "w") as fh:
            fh.write(url + "\n")
    rc = await natsclient.run_until_closed_or_stopped(
        watch, None if duration is None else max(0.0, start + duration - time.monotonic()))
    await runner.cleanup()
    await feed.stop()
    return rc
