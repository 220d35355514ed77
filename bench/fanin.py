#!/usr/bin/env python3
"""Fan-in: 10,000 simulated nodes heartbeating every 10 s plus bursts of 2,000 events/s into one
dashboard process. What is measured, and by whom (issue 27: no figure comes from the process under test):

* **The load** (this process): a real nats-server; the ``gna-nodes`` KV filled once with ``--nodes``
  node states (before anything is timed); then every second a tenth of the fleet heartbeats (core
  publish) and a burst of ``--rate`` condition messages is published into ``GNA_EVENTS`` (JetStream,
  async publish). For every event the generator keeps its id, its publish time (``time.time()`` when
  the message was made; the message's own ``time`` field is the same instant to the millisecond) and
  the stream sequence its publish acknowledgement gave.
* **The independent subscriber** (its own process and its own NATS connection, so neither the load
  generator nor the dashboard shares its event loop, its GIL or its clock reads): an ordered JetStream
  push consumer on ``gna.events.>`` from the first new message -- the same kind of delivery the
  dashboard's feed uses (fleet/follow.py), without the dashboard's work. Its callback notes only the
  arrival time (``time.time()``) and the raw message; ids are parsed after the run. Lag = arrival -
  publish time, for every event of the run; an event it never received is counted as missed.
* **The dashboard's applied lag** (a poller in its own process): ``GET /api/stats`` on one kept-alive
  connection every ``--poll-ms``. ``messages`` there is FleetState.messages_seen, a counter that
  apply_message raises once per event applied; the dashboard's feed applies ``gna.events.>`` through
  one ordered consumer in stream order (fleet/follow.py hands messages on in order, at most once). So
  the k-th event by stream sequence is applied when the counter has risen by k since the load began,
  and its applied time lies between the last poll that did not yet show it (the request's send time)
  and the first that did (the response's arrival). The figure is that upper bound -- when the
  dashboard first *showed* it -- minus its publish time; the lower bound is reported as well (the
  difference is the poll's resolution). It covers every event of the run and does not read the
  dashboard's own bounded lag window (``last_message_lag``, its last 10,000 messages), which the
  previous version of this bench reported; that window's figures are printed for comparison only. An
  event the counter never reaches within ``--drain`` s of the end is counted as missed; refused
  messages (``rejected``) are counted too, as they would shift the mapping.
* **CPU**: the dashboard's utime+stime (/proc) from the first event published until it has applied
  the last (or ``--drain`` ran out), over that wall time; what the polls themselves cost it is measured
  on the idle dashboard first (with and without the poller), and printed. The load generator's CPU is
  this process's over the load.
* **The baseline, in the same invocation**: the same load (same nodes, rate and duration) and the same
  independent subscriber with no dashboard running: the bus's own lag and the generator's own cost.

    python bench/fanin.py [--nodes 10000] [--rate 2000] [--seconds 20] [--poll-ms 20] [--no-record]

The result goes to bench/results/fanin.jsonl (bench/record.py: figures, baselines, parameters, commit,
machine, and a fingerprint of the code measured).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import http.client
import itertools
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import nats
import record as results
from procstat import cpu_seconds

from agent.message import rfc3339
from agent.nats_link import STREAM_SUBJECTS
from agent.nats_server import NatsServerProcess, free_port
from gna_sdk.ids import new_id
from gna_types.subjects import EVENTS_PREFIX, encode_token, event_subject

TYPES = ["GPUDevicesMissing", "IBPortDown", "NCCLSocketFallback", "JuiceFSCacheHitRatioLow", "GPUFatalXid"]
STREAM = "GNA_EVENTS"
SUBSCRIBER, POLLER = "_subscriber", "_poller"  # this script's helper processes (first argument)


def pct(values: list[float], p: float) -> float | None:
    """Nearest rank, as the dashboard's /api/stats computes its own (so old and new figures compare)."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def summary(lags_s: list[float]) -> dict[str, float | None]:
    """p50/p99/max in ms."""
    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 2)

    return {"p50": ms(pct(lags_s, 50)), "p99": ms(pct(lags_s, 99)), "max": ms(max(lags_s) if lags_s else None),
            "n": len(lags_s)}


# -- the load ---------------------------------------------------------------------------------------
async def setup(url: str, nodes: int) -> list[str]:
    """The stream and the KV state a fleet of agents keeps: once, before anything is timed."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        await js.add_stream(name=STREAM, subjects=STREAM_SUBJECTS, duplicate_window=600)
    except Exception:
        pass
    try:
        kv = await js.create_key_value(bucket="gna-nodes", history=1)
    except Exception:
        kv = await js.key_value("gna-nodes")
    names = [f"sim-{i:05d}.dc1" for i in range(nodes)]
    for name in names:
        await kv.put(encode_token(name), json.dumps({"node": name, "time": rfc3339(), "heartbeat_interval": 10,
                                                     "conditions": [], "agent_version": "0.1.0"}).encode())
    await nc.close()
    return names


@dataclass
class Load:
    published: dict[str, float] = field(default_factory=dict)  # event id -> publish time (epoch s)
    by_seq: list[tuple[int, str]] = field(default_factory=list)  # (stream sequence, event id), as acknowledged
    start: float = 0.0  # epoch s
    end: float = 0.0
    cpu_s: float = 0.0  # this process's CPU over the load
    late_ticks: int = 0  # 1 s ticks whose publishing took longer than the tick

    @property
    def sent(self) -> int:
        return len(self.published)


async def load(url: str, names: list[str], rate: int, seconds: float) -> Load:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out = Load()
    nodes = len(names)
    c0 = time.process_time()
    out.start = time.time()
    start = time.monotonic()
    tick = 0
    while time.monotonic() - start < seconds:
        t0 = time.monotonic()
        # 1/10 of the fleet heartbeats each 1 s tick (every node every 10 s)
        for name in names[tick % 10::10]:
            await nc.publish(f"gna.heartbeat.{encode_token(name)}",
                             json.dumps({"node": name, "time": rfc3339(), "heartbeat_interval": 10}).encode())
        futs = []
        ids = []
        for k in range(rate):
            node = names[(tick * rate + k) % nodes]
            status = "firing" if (k // nodes) % 2 == 0 else "resolved"
            eid, now = new_id(), time.time()
            msg = {"schema_version": 1, "id": eid, "time": rfc3339(now), "node": node, "collector": "infiniband",
                   "kind": "condition", "type": TYPES[k % len(TYPES)], "status": status, "severity": "critical",
                   "entity": f"ib:mlx5_{k % 8}/1", "reason": "Bench", "message": "bench", "details": {},
                   "suggested_action": "none"}
            out.published[eid] = now
            ids.append(eid)
            futs.append(await js.publish_async(event_subject(node, "infiniband", "critical"),
                                               json.dumps(msg).encode(), headers={"Nats-Msg-Id": eid}))
        acks = await asyncio.gather(*futs)
        out.by_seq.extend((int(a.seq), eid) for a, eid in zip(acks, ids, strict=True))
        tick += 1
        spent = time.monotonic() - t0
        out.late_ticks += spent > 1.0
        await asyncio.sleep(max(0.0, 1.0 - spent))
    out.end = time.time()
    out.cpu_s = time.process_time() - c0
    await nc.close()
    return out


# -- the helper processes ---------------------------------------------------------------------------
async def subscriber_main(url: str, out: str) -> None:
    """The independent subscriber: an ordered JetStream consumer on its own connection, from the next new
    message on; notes (arrival, raw message) and nothing else until SIGTERM, then writes (id, arrival)."""
    from nats.js.api import DeliverPolicy

    got: list[tuple[float, bytes]] = []

    async def cb(m: Any) -> None:
        got.append((time.time(), m.data))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    nc = await nats.connect(url, name="fanin-bench-subscriber")
    sub = await nc.jetstream().subscribe(f"{EVENTS_PREFIX}.>", stream=STREAM, cb=cb, ordered_consumer=True,
                                         idle_heartbeat=1.0, deliver_policy=DeliverPolicy.NEW)
    print("ready", flush=True)
    await stop.wait()
    await sub.unsubscribe()
    await nc.close()
    arrivals = []
    unparsed = 0
    for t, data in got:
        try:
            arrivals.append((json.loads(data)["id"], t))
        except (ValueError, KeyError, TypeError):
            unparsed += 1
    Path(out).write_text(json.dumps({"arrivals": arrivals, "unparsed": unparsed, "cpu_s": time.process_time()}))


def poller_main(port: int, every_ms: float, out: str) -> None:
    """The dashboard poller: GET /api/stats every ``every_ms`` on one kept-alive connection until SIGTERM;
    writes each poll's (sent, received, messages applied, messages refused)."""
    stopped = False

    def stop(_sig: int, _frame: Any) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    polls: list[tuple[float, float, int, int]] = []
    errors = 0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    every = every_ms / 1000
    due = time.monotonic()
    print("ready", flush=True)
    while not stopped:
        t0 = time.time()
        try:
            conn.request("GET", "/api/stats")
            body = conn.getresponse().read()
            t1 = time.time()
            s = json.loads(body)
            polls.append((t0, t1, int(s["messages"]), sum(int(n) for n in s["rejected"].values())))
        except (OSError, http.client.HTTPException, ValueError, KeyError):
            errors += 1
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        due = max(due + every, time.monotonic())  # late: the next poll at once, no burst to catch up
        time.sleep(max(0.0, due - time.monotonic()))
    conn.close()
    Path(out).write_text(json.dumps({"polls": polls, "errors": errors, "cpu_s": time.process_time()}))


async def spawn(*args: str) -> subprocess.Popen[str]:
    """One of this script's helper processes, once it says it is ready."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"{args[0]}: did not start ({line!r}, exit {proc.poll()})")
    return proc


async def finish(proc: subprocess.Popen[str], out: Path) -> dict[str, Any]:
    proc.send_signal(signal.SIGTERM)
    rc = await asyncio.to_thread(proc.wait, 60)
    if rc != 0 or not out.is_file():
        raise RuntimeError(f"{out.name}: helper exited {rc} without its result")
    data: dict[str, Any] = json.loads(out.read_text())
    return data


# -- what was measured ------------------------------------------------------------------------------
def subscriber_lags(ld: Load, sub: dict[str, Any]) -> tuple[list[float], dict[str, int]]:
    first: dict[str, float] = {}
    dup = foreign = 0
    for eid, t in sub["arrivals"]:
        if eid not in ld.published:
            foreign += 1
        elif eid in first:
            dup += 1
        else:
            first[eid] = t
    lags = [first[e] - t for e, t in ld.published.items() if e in first]
    return lags, {"received": len(first), "missed": ld.sent - len(first), "duplicates": dup, "foreign": foreign,
                  "unparsed": int(sub.get("unparsed", 0))}


def dashboard_lags(ld: Load, polls: list[list[float]], count0: int
                   ) -> tuple[list[float], list[float], dict[str, Any]]:
    """Per event (in stream order): the first poll whose applied count covers its rank. Upper bound: that
    poll's response; lower bound: the previous poll's request (or the publish time, if later)."""
    polls = sorted(polls, key=lambda p: p[0])
    applied: list[int] = []
    top = 0
    for p in polls:
        top = max(top, int(p[2]) - count0)  # a counter: never lower (a poll answered out of order)
        applied.append(top)
    upper: list[float] = []
    lower: list[float] = []
    missed = 0
    for rank, (_, eid) in enumerate(sorted(ld.by_seq), start=1):
        i = bisect.bisect_left(applied, rank)
        if i == len(applied):
            missed += 1
            continue
        t_pub = ld.published[eid]
        upper.append(polls[i][1] - t_pub)
        lower.append(max(0.0, (polls[i - 1][0] if i else t_pub) - t_pub))
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(polls)]
    rtts = [p[1] - p[0] for p in polls]
    info = {"applied": applied[-1] if applied else 0, "missed": missed, "polls": len(polls),
            "poll_interval_p50_ms": round((pct(gaps, 50) or 0) * 1000, 2),
            "poll_interval_max_ms": round(max(gaps, default=0) * 1000, 2),
            "poll_rtt_p50_ms": round((pct(rtts, 50) or 0) * 1000, 2),
            "poll_rtt_p99_ms": round((pct(rtts, 99) or 0) * 1000, 2),
            "rejected": int(polls[-1][3] - polls[0][3]) if polls else 0}
    return upper, lower, info


def get_json(port: int, path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).read())
    return data


async def settled(port: int, nodes: int, quiet_s: float = 1.0, timeout: float = 60.0) -> dict[str, Any]:
    """The dashboard up, the fleet's KV state in and its history replay over (no new message for ``quiet_s``)."""
    t_end = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    since = time.monotonic()
    while time.monotonic() < t_end:
        try:
            s = get_json(port, "/api/stats")
        except OSError:
            await asyncio.sleep(0.2)
            continue
        if last is None or s["messages"] != last["messages"] or s["nodes"] < nodes:
            last, since = s, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return s
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the dashboard did not settle in {timeout:.0f} s (last stats {last})")


async def idle_cpu(pid: int, seconds: float) -> float:
    c0, w0 = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - w0)


# -- the bench --------------------------------------------------------------------------------------
async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="gna-fanin-") as tmp_name:
        tmp = Path(tmp_name)
        server = NatsServerProcess(tmp / "nats", extra_config="max_payload: 1MB")
        server.start()
        try:
            names = await setup(server.url, args.nodes)

            # baseline: the same load and the same independent subscriber, no dashboard
            sub = await spawn(SUBSCRIBER, server.url, str(tmp / "base-sub.json"))
            base = await load(server.url, names, args.rate, args.seconds)
            await asyncio.sleep(args.settle)
            base_sub = await finish(sub, tmp / "base-sub.json")

            port = free_port()
            dash = subprocess.Popen([sys.executable, "-m", "agent", "dashboard", "--nats", server.url, "--listen",
                                     f"127.0.0.1:{port}", "--history-hours", "0.001"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                await settled(port, args.nodes)
                cpu_idle = await idle_cpu(dash.pid, args.idle)
                poller = await spawn(POLLER, str(port), str(args.poll_ms), str(tmp / "polls.json"))
                cpu_idle_polled = await idle_cpu(dash.pid, args.idle)
                sub = await spawn(SUBSCRIBER, server.url, str(tmp / "sub.json"))
                before = get_json(port, "/api/stats")
                count0 = int(before["messages"])
                d0, w0 = cpu_seconds(dash.pid), time.monotonic()
                run = await load(server.url, names, args.rate, args.seconds)
                t_drain = time.monotonic() + args.drain
                while time.monotonic() < t_drain:  # until it has applied the last event
                    if int(get_json(port, "/api/stats")["messages"]) - count0 >= run.sent:
                        break
                    await asyncio.sleep(0.1)
                d1, w1 = cpu_seconds(dash.pid), time.monotonic()
                await asyncio.sleep(args.settle)  # the subscriber's last arrivals
                polled = await finish(poller, tmp / "polls.json")
                run_sub = await finish(sub, tmp / "sub.json")
                stats = get_json(port, "/api/stats")
                t_api = time.perf_counter()
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview", timeout=30).read()
                overview_ms = (time.perf_counter() - t_api) * 1000
            finally:
                dash.terminate()
                dash.wait(10)
        finally:
            server.stop()

    base_lags, base_n = subscriber_lags(base, base_sub)
    sub_lags, sub_n = subscriber_lags(run, run_sub)
    up, low, dash_n = dashboard_lags(run, polled["polls"], count0)
    b, s, d, dl = summary(base_lags), summary(sub_lags), summary(up), summary(low)
    dash_cpu = (d1 - d0) / (w1 - w0)
    poll_cost = max(0.0, cpu_idle_polled - cpu_idle)
    gen_base, gen_run = base.cpu_s / (base.end - base.start), run.cpu_s / (run.end - run.start)
    window = {k: stats.get(k) for k in ("lag_p50_s", "lag_p99_s", "lag_max_s")}

    def line(x: dict[str, float | None]) -> str:
        return f"p50 {x['p50']} ms, p99 {x['p99']} ms, max {x['max']} ms"

    print(f"load: {args.nodes:,} nodes heartbeating every 10 s + {args.rate:,} events/s for {args.seconds:.0f} s: "
          f"{run.sent:,} events ({run.late_ticks} late ticks); load generator at {gen_run * 100:.0f}% of a core")
    print(f"baseline, same load, no dashboard: {base.sent:,} events ({base.late_ticks} late ticks); load generator "
          f"at {gen_base * 100:.0f}% of a core")
    print(f"  independent subscriber lag (publish -> arrival), all {b['n']:,} received: {line(b)}; "
          f"missed {base_n['missed']}, duplicates {base_n['duplicates']}")
    print(f"with the dashboard:\n  independent subscriber lag, all {s['n']:,} received: {line(s)}; "
          f"missed {sub_n['missed']}, duplicates {sub_n['duplicates']}")
    print(f"  dashboard applied lag (publish -> first /api/stats showing it), {d['n']:,} events: {line(d)}  "
          f"(goal p99 <= 1 s)")
    print(f"    lower bound (publish -> the poll before): {line(dl)}; polls every {dash_n['poll_interval_p50_ms']} ms "
          f"(max gap {dash_n['poll_interval_max_ms']} ms, request p50 {dash_n['poll_rtt_p50_ms']} ms)")
    print(f"    not applied within {args.drain:.0f} s of the end: {dash_n['missed']}; refused: {dash_n['rejected']}; "
          f"applied {dash_n['applied']:,} of {run.sent:,}")
    print(f"  dashboard CPU over the load: {dash_cpu * 100:.1f}% of a core (idle {cpu_idle * 100:.1f}%, idle with the "
          f"polls {cpu_idle_polled * 100:.1f}%: the polls cost ~{poll_cost * 100:.1f}%)")
    print(f"  /api/overview of the whole fleet: {overview_ms:.0f} ms")
    own = {k: "?" if v is None else f"{float(v) * 1000:.1f}" for k, v in window.items()}
    print(f"  (for comparison only, the dashboard's own last-10,000 window: p50 {own['lag_p50_s']} ms, "
          f"p99 {own['lag_p99_s']} ms, max {own['lag_max_s']} ms)")

    no_dash = "independent subscriber, same load, no dashboard"
    same_run = "independent subscriber, same run"
    figs = []
    for q in ("p50", "p99", "max"):
        figs.append(results.figure(f"lag {q}, independent subscriber, dashboard running", s[q] or 0, "ms",
                                   baseline=b[q], baseline_name=no_dash, higher_is_better=False))
    for q in ("p50", "p99", "max"):
        figs.append(results.figure(f"lag {q}, dashboard applied (polled)", d[q] or 0, "ms", baseline=s[q],
                                   baseline_name=same_run, higher_is_better=False,
                                   goal="<= 1000 ms" if q == "p99" else ""))
    figs += [
        results.figure("dashboard CPU over the load", round(dash_cpu * 100, 1), "% of a core",
                       higher_is_better=False),
        results.figure("dashboard CPU of the /api/stats polls (idle)", round(poll_cost * 100, 1), "% of a core",
                       higher_is_better=False),
        results.figure("events missed, independent subscriber", sub_n["missed"], "events",
                       baseline=base_n["missed"], baseline_name=no_dash, higher_is_better=False),
        results.figure("events missed, dashboard", dash_n["missed"], "events",
                       higher_is_better=False),
        results.figure("load generator CPU", round(gen_run * 100, 1), "% of a core", baseline=round(gen_base * 100, 1),
                       baseline_name="same load, no dashboard", higher_is_better=False),
        results.figure("/api/overview of the whole fleet", round(overview_ms), "ms", higher_is_better=False),
    ]
    results.record("fanin", figs, params={k: v for k, v in vars(args).items() if k != "no_record"},
                   raw={"events": run.sent, "baseline_events": base.sent, "late_ticks": run.late_ticks,
                        "baseline_late_ticks": base.late_ticks, "subscriber": {**s, **sub_n},
                        "baseline_subscriber": {**b, **base_n}, "dashboard": {**d, **dash_n},
                        "dashboard_lower_bound": dl, "dashboard_own_window_s": window,
                        "dashboard_cpu_idle": round(cpu_idle, 4),
                        "dashboard_cpu_idle_polled": round(cpu_idle_polled, 4),
                        "subscriber_cpu_s": run_sub.get("cpu_s"), "poller_cpu_s": polled.get("cpu_s"),
                        "poller_errors": polled.get("errors")},
                   write=not args.no_record)


def cli() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == SUBSCRIBER:
        asyncio.run(subscriber_main(sys.argv[2], sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == POLLER:
        poller_main(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--rate", type=int, default=2000, help="events/s")
    ap.add_argument("--seconds", type=float, default=20.0, help="the load, with and without the dashboard")
    ap.add_argument("--poll-ms", type=float, default=20.0, help="how often the dashboard's applied count is read")
    ap.add_argument("--drain", type=float, default=15.0, help="s after the load for the dashboard to apply the rest")
    ap.add_argument("--settle", type=float, default=2.0, help="s after the load for the subscriber's last arrivals")
    ap.add_argument("--idle", type=float, default=2.0, help="s of idle dashboard CPU, without and with the polls")
    ap.add_argument("--no-record", action="store_true", help="print only: nothing appended to bench/results/")
    asyncio.run(main(ap.parse_args()))


if __name__ == "__main__":
    cli()
