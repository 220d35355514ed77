"""The active validation: which checks each level runs, how each tool is run and judged, and the report.

Levels (docs/validate.md):

* ``quick``: the passive checks (``gpu-node-agent check``'s one pass of every collector) and a short
  all_reduce_perf over every GPU at the SKU's message size (``-n 10 -w 2``): under a minute on 8 GPUs;
* ``standard``: quick, then nvbandwidth (host-to-device, device-to-host, device-to-device read: Azure's three),
  ``dcgmi diag -r 2`` and an ib_write_bw GPUDirect loopback on every active InfiniBand port; all_reduce_perf
  with its default iterations;
* ``full``: standard with a sweep of all_reduce_perf sizes from 1 MiB to the SKU's size (``-n 50``), ``dcgmi diag
  -r 3`` (``validate.full_dcgm_level``: 4 is the hours-long extended run) and longer ib_write_bw runs.

Every check is skipped, with the reason, when its tool is absent (``validate.tools.<tool>``, else PATH) or the
node lacks what it needs (GPUs, two GPUs, an active InfiniBand port). Nothing runs while a process holds a GPU
(``gna_sdk.gpu_processes``: /proc/<pid>/fd links to /dev/nvidia<n>) unless forced: the verdict is "busy".
Each tool runs without a shell, in its own process group (killed whole at its timeout), its stdout and stderr
read to ``validate.max_output_bytes`` each and the rest drained. A check is "failed" when its figures are under
its thresholds, the tool reported a failure or exited nonzero, or it ran past its timeout; "error" when its
output could not be read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import msgspec

from agent import config as configmod
from agent.config import AgentConfig
from agent.validate import dcgm_diag, nccl_tests, nvbandwidth, perftest
from agent.validate.thresholds import Limits, Topology, limits_for, read_topology
from gna_sdk import gpu_processes, plural
from gna_sdk.hostroot import HostRoot
from gna_types.validation import CHECKS, LEVELS, CheckResult, Status, ValidationReport

LEVEL_CHECKS = {"quick": ("passive", "nccl_allreduce"), "standard": CHECKS, "full": CHECKS}
TOOLS = {"nccl_allreduce": "all_reduce_perf", "nvbandwidth": "nvbandwidth", "dcgm_diag": "dcgmi",
         "ib_write_bw": "ib_write_bw"}
NVB_TESTS = {"h2d": "host_to_device_memcpy_ce", "d2h": "device_to_host_memcpy_ce",
             "p2p": "device_to_device_memcpy_read_ce"}  # Azure's check_gpu_bw's three
IB_MESSAGE_BYTES = 8388608  # azure_ib_write_bw_gdr.nhc MESSAGE_SIZE
REASON_MAX = 1900
MAX_LISTED = 8  # failing cells/tests named in a reason
KILL_WAIT = 5.0


def _cut(text: str, limit: int = REASON_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class Ran:
    rc: int | None  # None: killed at the timeout
    out: str
    err: str
    seconds: float
    timed_out: bool = False


async def _drain(stream: asyncio.StreamReader | None, limit: int) -> bytes:
    if stream is None:
        return b""
    kept = bytearray()
    while chunk := await stream.read(65536):
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    return bytes(kept)


async def run_tool(argv: list[str], *, timeout: float, limit: int) -> Ran:
    """Run a fixed argv (no shell) in its own process group; the whole group is killed at ``timeout``."""
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    reads = asyncio.gather(_drain(proc.stdout, limit), _drain(proc.stderr, limit))
    try:
        out, err = await asyncio.wait_for(asyncio.shield(reads), timeout)
        rc: int | None = await asyncio.wait_for(proc.wait(), KILL_WAIT)
        timed_out = False
    except TimeoutError:
        _kill_group(proc.pid)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), KILL_WAIT)
        try:
            out, err = await asyncio.wait_for(reads, KILL_WAIT)
        except TimeoutError:  # a grandchild outside the group still holds the pipe
            reads.cancel()
            out = err = b""
        rc, timed_out = None, True
    except asyncio.CancelledError:
        _kill_group(proc.pid)
        raise
    return Ran(rc=rc, out=out.decode("utf-8", "replace"), err=err.decode("utf-8", "replace"),
               seconds=time.monotonic() - start, timed_out=timed_out)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # the group the tool leads (start_new_session): its own children only


def find_tool(name: str, configured: str) -> tuple[str | None, str]:
    """The executable, or None and why not."""
    if configured:
        if os.path.isfile(configured) and os.access(configured, os.X_OK):
            return configured, ""
        return None, f"{configured} (validate.tools.{name}) is not an executable file"
    path = shutil.which(name)
    return (path, "") if path else (None, f"{name} not found on PATH (set validate.tools.{name})")


def _tail(ran: Ran, lines: int = 3) -> str:
    text = "\n".join(x for x in (ran.err.strip(), ran.out.strip()) if x)
    return " | ".join(text.splitlines()[-lines:])[:400]


@dataclass
class Context:
    cfg: AgentConfig
    host: HostRoot
    level: str
    topo: Topology
    limits: Limits
    collectors: dict[str, Any] | None


def _size_arg(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if mult > 1 else text) * mult


# -- the checks ----------------------------------------------------------------------------------------------


async def check_passive(ctx: Context) -> CheckResult:
    from agent.check import run_check

    start = time.monotonic()
    agent = msgspec.structs.replace(ctx.cfg, host_root=str(ctx.host.root))
    config = configmod.Config(agent=agent, collectors=dict(ctx.collectors or {}), source="<validate>")
    try:
        report = await asyncio.wait_for(run_check(config), ctx.cfg.validate.timeouts.passive)
    except TimeoutError:
        return CheckResult(name="passive", status="failed", duration_s=time.monotonic() - start,
                           reason=f"the collectors' pass ran past {ctx.cfg.validate.timeouts.passive:g}s")
    found = [f"[{m['severity']}] {m['type']} {m['entity']}: {m['message']}" for m in
             report["conditions"] + report["events"]]
    status: Status = "failed" if report["status"] == "unhealthy" else "passed"
    figures = {"conditions": float(len(report["conditions"])), "events": float(len(report["events"])),
               "not_seen": float(len(report["not_seen"]))}
    reason = report["status"] + (": " + "; ".join(found[:MAX_LISTED]) if found else "")
    return CheckResult(name="passive", status=status, reason=_cut(reason), figures=figures,
                       argv=["gpu-node-agent", "check"], duration_s=time.monotonic() - start)


async def check_nccl(ctx: Context, exe: str) -> CheckResult:
    n = len(ctx.topo.gpus)
    if n < 2:
        return CheckResult(name="nccl_allreduce", status="skipped", reason=f"an all-reduce needs 2 GPUs, the node "
                           f"has {n}")
    size = ctx.limits.allreduce_bytes
    if ctx.level == "full":
        low = "1M" if _size_arg(size) > (1 << 20) else size
        argv = [exe, "-b", low, "-e", size, "-f", "2", "-g", str(n), "-c", "1", "-n", "50", "-w", "5"]
    elif ctx.level == "standard":
        argv = [exe, "-b", size, "-e", size, "-f", "2", "-g", str(n), "-c", "1"]
    else:
        argv = [exe, "-b", size, "-e", size, "-f", "2", "-g", str(n), "-c", "1", "-n", "10", "-w", "2"]
    ran = await run_tool(argv, timeout=ctx.cfg.validate.timeouts.nccl_allreduce,
                         limit=ctx.cfg.validate.max_output_bytes)
    res = nccl_tests.parse(ran.out + "\n" + ran.err)
    largest = res.largest
    figures: dict[str, float] = {"wrong": float(res.wrong)}
    if largest is not None and largest.busbw is not None:
        figures["busbw"] = largest.busbw
        figures["size_bytes"] = float(largest.size)
    if res.avg_busbw is not None:
        figures["avg_busbw"] = res.avg_busbw
    if res.out_of_bounds is not None:
        figures["out_of_bounds"] = float(res.out_of_bounds)
    thresholds = {"busbw": ctx.limits.allreduce_busbw} if ctx.limits.allreduce_busbw is not None else {}
    sources = {"busbw": ctx.limits.sources["allreduce"]} if "allreduce" in ctx.limits.sources else {}
    result = CheckResult(name="nccl_allreduce", status="passed", figures=figures, thresholds=thresholds,
                         sources=sources, argv=argv, rc=ran.rc, duration_s=ran.seconds)
    problems: list[str] = []
    if ran.timed_out:
        problems.append(f"ran past its {ctx.cfg.validate.timeouts.nccl_allreduce:g}s timeout (killed)")
    problems += [f"the tool reported: {line}" for line in res.failures[:3]]
    if res.wrong:
        problems.append(f"#wrong {res.wrong} (data corruption: must be 0)")
    if res.out_of_bounds:
        problems.append(f"Out of bounds values: {res.out_of_bounds} FAILED")
    if ran.rc not in (0, None):
        problems.append(f"exit status {ran.rc}" + (f": {_tail(ran)}" if not res.failures else ""))
    if problems:
        result.status, result.reason = "failed", _cut("; ".join(problems))
        return result
    if largest is None or largest.busbw is None:
        result.status = "error"
        result.reason = _cut(f"no result row in all_reduce_perf's output ({_tail(ran) or 'empty'})")
        return result
    if not res.checked:
        result.status, result.reason = "error", "no #wrong figure: data checking was off (-c 0)"
        return result
    limit = ctx.limits.allreduce_busbw
    if limit is not None and largest.busbw < limit:
        result.status = "failed"
        result.reason = f"busbw {largest.busbw:.1f} GB/s at {largest.size} B < {limit:g} GB/s"
    else:
        result.reason = (f"busbw {largest.busbw:.1f} GB/s at {largest.size} B" +
                         (f" >= {limit:g}" if limit is not None else " (no threshold for this node)") + ", #wrong 0")
    return result


async def check_nvbandwidth(ctx: Context, exe: str) -> CheckResult:
    if not ctx.topo.gpus:
        return CheckResult(name="nvbandwidth", status="skipped", reason="no NVIDIA GPU on the PCI bus")
    argv = [exe, "-t", *NVB_TESTS.values()]
    if ctx.level == "full":
        argv += ["-i", "10"]
    ran = await run_tool(argv, timeout=ctx.cfg.validate.timeouts.nvbandwidth, limit=ctx.cfg.validate.max_output_bytes)
    res = nvbandwidth.parse(ran.out)
    lim = ctx.limits
    thresholds = {k: v for k, v in (("h2d", lim.h2d), ("d2h", lim.d2h), ("p2p", lim.p2p)) if v is not None}
    figures: dict[str, float] = {}
    low: list[str] = []
    problems: list[str] = []
    for short, key in NVB_TESTS.items():
        status = res.status.get(key, "")
        if status.startswith("Error") or status == "Not Found":
            problems.append(f"{key}: {status}")
        matrix = res.matrices.get(key)
        if matrix is None:
            if status != "Waived" and not (short == "p2p" and len(ctx.topo.gpus) < 2):
                problems.append(f"{key}: no matrix in the output")
            continue
        for row, col, value in matrix.measured():
            name = f"{short}:{col}" if short != "p2p" else f"p2p:{row}-{col}"
            figures[name] = value
            if short in thresholds and value < thresholds[short]:
                low.append(f"{name} {value:.1f} < {thresholds[short]:g} GB/s")
    result = CheckResult(name="nvbandwidth", status="passed", figures=figures, thresholds=thresholds,
                         sources={k: lim.sources[k] for k in thresholds if k in lim.sources}, argv=argv, rc=ran.rc,
                         duration_s=ran.seconds)
    if ran.timed_out:
        problems.insert(0, f"ran past its {ctx.cfg.validate.timeouts.nvbandwidth:g}s timeout (killed)")
    elif ran.rc != 0:
        problems.insert(0, f"exit status {ran.rc}: {_tail(ran)}")
    if low:
        problems.append(f"{plural(len(low), 'figure')} under threshold: " + ", ".join(low[:MAX_LISTED]))
    if problems:
        result.status, result.reason = "failed", _cut("; ".join(problems))
    elif not figures:
        result.status, result.reason = "error", _cut(f"no bandwidth in nvbandwidth's output ({_tail(ran) or 'empty'})")
    else:
        result.reason = (f"{plural(len(figures), 'figure')}, lowest " +
                         ", ".join(f"{k} {min(v for n, v in figures.items() if n.startswith(k + ':')):.1f}"
                                   for k in NVB_TESTS if any(n.startswith(k + ":") for n in figures)) + " GB/s")
    return result


async def check_dcgm(ctx: Context, exe: str) -> CheckResult:
    if not ctx.topo.gpus:
        return CheckResult(name="dcgm_diag", status="skipped", reason="no NVIDIA GPU on the PCI bus")
    level = ctx.cfg.validate.full_dcgm_level if ctx.level == "full" else 2
    argv = [exe, "diag", "-r", str(level), "-j"]
    ran = await run_tool(argv, timeout=ctx.cfg.validate.timeouts.dcgm_diag, limit=ctx.cfg.validate.max_output_bytes)
    res = dcgm_diag.parse(ran.out)
    statuses = [t.status for t in res.tests]
    figures = {"tests": float(len(res.tests)), "failed": float(len(res.failed)), "warned": float(len(res.warned)),
               "skipped": float(statuses.count("skip") + statuses.count("not_run"))}
    result = CheckResult(name="dcgm_diag", status="passed", figures=figures, argv=argv, rc=ran.rc,
                         duration_s=ran.seconds, sources={"levels": "dcgmi diag -r (NVIDIA/DCGM v4.6.0 dcgmi)"})
    if ran.timed_out:
        result.status = "failed"
        result.reason = f"ran past its {ctx.cfg.validate.timeouts.dcgm_diag:g}s timeout (killed)"
    elif res.runtime_error:
        result.status, result.reason = "error", _cut(f"dcgmi could not run the diagnostic: {res.runtime_error}")
    elif res.failed:
        parts = [f"{t.category}/{t.name}: {t.status}" + (f" ({'; '.join(t.messages[:2])})" if t.messages else "")
                 for t in res.failed[:MAX_LISTED]]
        result.status, result.reason = "failed", _cut(f"{plural(len(res.failed), 'test')} failed: " + "; ".join(parts))
    elif res.error or not res.tests:
        why = res.error or "no test in the report"
        result.status = "failed" if ran.rc else "error"
        result.reason = _cut(f"{why} (exit status {ran.rc}: {_tail(ran)})" if ran.rc else why)
    elif ran.rc:
        result.status, result.reason = "failed", _cut(f"exit status {ran.rc} with every test passed: {_tail(ran)}")
    else:
        warned = "; ".join(f"{t.name}: {'; '.join(t.messages[:1])}" for t in res.warned[:MAX_LISTED])
        result.reason = _cut(f"level {level} ({res.layout}): {plural(len(res.tests), 'test')}, none failed" +
                             (f"; warnings: {warned}" if warned else ""))
    return result


async def _loopback(ctx: Context, exe: str, hca: str, port: int, gpu: int,
                    tcp_port: int) -> tuple[list[str], Ran, Ran | None]:
    common = [exe, "-d", hca, "-i", str(port), "-p", str(tcp_port), "-s", str(IB_MESSAGE_BYTES), "-F",
              "--report_gbits", "--perform_warm_up", f"--use_cuda={gpu}"]
    if ctx.level == "full":
        common += ["-n", "20000"]
    timeout = ctx.cfg.validate.timeouts.ib_write_bw
    limit = ctx.cfg.validate.max_output_bytes
    server = asyncio.create_task(run_tool(common, timeout=timeout, limit=limit))
    await asyncio.sleep(ctx.cfg.validate.server_start_delay)
    client_argv = [*common, "localhost"]
    try:
        client = await run_tool(client_argv, timeout=timeout, limit=limit)
    except BaseException:
        server.cancel()
        raise
    try:
        served: Ran | None = await asyncio.wait_for(asyncio.shield(server), KILL_WAIT if client.rc == 0 else 0.5)
    except TimeoutError:
        server.cancel()  # kills its group
        with contextlib.suppress(asyncio.CancelledError):
            await server
        served = None
    return client_argv, client, served


async def check_ib(ctx: Context, exe: str) -> CheckResult:
    ports = [p for p in ctx.topo.ib_ports if p.active]
    if not ctx.topo.gpus:
        return CheckResult(name="ib_write_bw", status="skipped", reason="no NVIDIA GPU for GPUDirect RDMA")
    if not ports:
        why = "no InfiniBand port in /sys/class/infiniband" if not ctx.topo.ib_ports else \
            "no ACTIVE InfiniBand port (" + ", ".join(f"{p.hca}:{p.port}" for p in ctx.topo.ib_ports[:8]) + ")"
        return CheckResult(name="ib_write_bw", status="skipped", reason=why)
    start = time.monotonic()
    runs = await asyncio.gather(*(
        _loopback(ctx, exe, p.hca, p.port, i % len(ctx.topo.gpus), ctx.cfg.validate.ib_port_base + i)
        for i, p in enumerate(ports[:64])))
    figures: dict[str, float] = {}
    problems: list[str] = []
    rcs: list[int | None] = []
    for p, (_argv, client, _server) in zip(ports, runs, strict=False):
        name = f"{p.hca}:{p.port}"
        rcs.append(client.rc)
        res = perftest.parse(client.out + "\n" + client.err)
        bw = res.average_gbits
        if bw is not None:
            figures[name] = round(bw, 2)
        limit = ctx.limits.ib_gdr.get(name)
        if client.timed_out:
            problems.append(f"{name}: ran past its {ctx.cfg.validate.timeouts.ib_write_bw:g}s timeout (killed)")
        elif res.failures:
            problems.append(f"{name}: {res.failures[0]}" + (f" (exit status {client.rc})" if client.rc else ""))
        elif client.rc:
            problems.append(f"{name}: exit status {client.rc}: {_tail(client)}")
        elif bw is None:
            problems.append(f"{name}: no result row in ib_write_bw's output")
        elif limit is not None and bw < limit:
            problems.append(f"{name}: {bw:.1f} < {limit:g} Gb/s")
    thresholds = {f"{p.hca}:{p.port}": ctx.limits.ib_gdr[f"{p.hca}:{p.port}"] for p in ports
                  if f"{p.hca}:{p.port}" in ctx.limits.ib_gdr}
    result = CheckResult(name="ib_write_bw", status="passed", figures=figures, thresholds=thresholds,
                         sources={"ib_gdr": ctx.limits.sources["ib_gdr"]} if "ib_gdr" in ctx.limits.sources else {},
                         argv=runs[0][0], rc=max((r for r in rcs if r is not None), default=None),
                         duration_s=time.monotonic() - start)
    if problems:
        result.status, result.reason = "failed", _cut("; ".join(problems[:MAX_LISTED]))
    else:
        result.reason = f"GPUDirect loopback on {plural(len(ports), 'port')}: " + ", ".join(
            f"{k} {v:.1f}" for k, v in list(figures.items())[:MAX_LISTED]) + " Gb/s"
    return result


RUNNERS = {"nccl_allreduce": check_nccl, "nvbandwidth": check_nvbandwidth, "dcgm_diag": check_dcgm,
           "ib_write_bw": check_ib}


# -- the run ---------------------------------------------------------------------------------------------------


def gpu_holders(host: HostRoot) -> tuple[list[str], str]:
    """Who holds a GPU ("pid comm -> /dev/nvidia<n>"), and why the answer may be incomplete ("" when complete).
    This process itself is left out (the daemon's NVML handle), found through the tree's /proc/self."""
    use = gpu_processes.scan(host)
    own = gpu_processes.own_pid(host)
    holders = [f"{pid} {comm} -> /dev/nvidia{minor}" for minor, procs in sorted(use.by_minor.items())
               for pid, comm in procs if pid != own]
    incomplete = "" if use.complete else (
        f"{plural(use.unreadable, 'process')}' open files could not be read" if use.unreadable
        else "more processes than could be scanned")
    return holders, incomplete


def _verdict(checks: list[CheckResult]) -> tuple[str, str]:
    bad = [c for c in checks if c.status in ("failed", "error")]
    ran = [c for c in checks if c.status != "skipped"]
    if bad:
        return "failed", "; ".join(f"{c.name}: {c.reason}" for c in bad)
    if not ran:
        return "unavailable", "no check could run: " + "; ".join(f"{c.name}: {c.reason}" for c in checks)
    skipped = [c.name for c in checks if c.status == "skipped"]
    return "passed", f"{plural(len(ran), 'check')} passed" + (f", skipped: {', '.join(skipped)}" if skipped else "")


async def run_validation(cfg: AgentConfig, host: HostRoot, level: str, *, force: bool = False,
                         skip: Collection[str] = (), collectors: dict[str, Any] | None = None,
                         node: str = "") -> ValidationReport:
    """Validate the node at ``level`` ("quick", "standard", "full"). Refused ("busy") while a process holds a
    GPU unless ``force``; ``skip`` names checks not to run; ``collectors``: the collectors' parsed settings for
    the passive check (default: each collector's defaults)."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}: one of {', '.join(LEVELS)}")
    started = time.time()
    topo = read_topology(host)
    limits = limits_for(topo, cfg.validate.sku, cfg.validate.thresholds)
    report = ValidationReport(node=_cut(node or cfg.node_name() or socket.gethostname(), 256), level=level,  # type: ignore[arg-type]
                              verdict="passed", sku=limits.sku.key if limits.sku else "",
                              gpu_model=_cut(topo.model, 256), gpu_count=min(len(topo.gpus), 1024), forced=force,
                              notes=[_cut(n, 500) for n in limits.notes][:16], started=started)
    holders, incomplete = gpu_holders(host)
    report.holders = [_cut(h, 500) for h in holders[:32]]
    if (holders or incomplete) and not force:
        report.verdict = "busy"
        report.reason = _cut("refused: " + (f"{plural(len(holders), 'process')} hold GPUs ({'; '.join(holders[:4])})"
                                            if holders else f"cannot tell whether GPUs are in use: {incomplete}") +
                             "; rerun with --force to validate anyway")
        report.ended = time.time()
        return report
    if incomplete:
        report.notes.append(_cut(f"forced although {incomplete}", 500))
    checks: list[CheckResult] = []
    if limits.mismatch:
        checks.append(CheckResult(name="topology", status="failed", reason=_cut(limits.mismatch),
                                  figures={"gpus": float(len(topo.gpus))},
                                  thresholds={"gpus": float(limits.sku.gpus)} if limits.sku else {},
                                  sources={"gpus": limits.sku.source} if limits.sku else {}))
    ctx = Context(cfg=cfg, host=host, level=level, topo=topo, limits=limits, collectors=collectors)
    tools = cfg.validate.tools
    for name in LEVEL_CHECKS[level]:
        if name in skip:
            checks.append(CheckResult(name=name, status="skipped", reason="skipped on request (--skip)"))
            continue
        if name == "passive":
            checks.append(await check_passive(ctx))
            continue
        tool = TOOLS[name]
        exe, why = find_tool(tool, getattr(tools, tool))
        if exe is None:
            checks.append(CheckResult(name=name, status="skipped", reason=why))
            continue
        try:
            checks.append(await RUNNERS[name](ctx, exe))
        except OSError as exc:  # could not start it (ENOEXEC, EACCES)
            checks.append(CheckResult(name=name, status="error", reason=_cut(f"{exe} could not run: {exc}")))
    report.checks = checks
    verdict, reason = _verdict(checks)
    report.verdict, report.reason = verdict, _cut(reason)  # type: ignore[assignment]
    report.ended = time.time()
    return report
