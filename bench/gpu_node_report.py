"""On a real GPU node: what NVML says, next to what the collectors concluded (issue 16 deliver 5).

    .venv/bin/python bench/gpu_node_report.py [--host-root /] [--gpm-seconds 2] [--out report.json]

Prints, per GPU, the raw NVML readings the nvml and topology collectors use (name, bus id, PCIe
generation/width now and max, every NVLink's state and remote PCI device, clock event reasons as
bits and names, temperature and thermal margin, fabric state, GPM SM/tensor/DRAM activity over
``--gpm-seconds``), then the PCIe/NVLink matrix the topology collector derives (``gpu-node-agent
topo``) next to ``nvidia-smi topo -m`` when the binary is there (every cell compared), then the
conditions and events one pass of every collector concludes (``gpu-node-agent check``). With
``--out`` everything is also written as JSON, to record in docs/benchmarks.md.

Exit 0 with a report; 69 when NVML does not load (no GPU or driver here: nothing to compare).
Needs no GPU to be imported or linted; the tests never run it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.check import check_roots
from collectors.nvml import CLOCK_EVENT_REASONS, GPM_METRICS
from collectors.shared.nvml_lib import load_nvml
from collectors.topology import probe_nvml, render_text, topology_report
from gna_types.entities import normal_pci

EX_UNAVAILABLE = 69


def _try(nv: Any, name: str, *args: Any) -> Any:
    fn = getattr(nv, name, None)
    if fn is None:
        return f"<{name} is not in this nvidia-ml-py>"
    try:
        return fn(*args)
    except Exception as exc:  # NOT_SUPPORTED, an old driver, a binding without the call: shown, not fatal
        return f"<{type(exc).__name__}: {exc}>"


def _decode(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def gpu_readings(nv: Any, h: Any, gpm_seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": _decode(_try(nv, "nvmlDeviceGetName", h)),
        "bus_id": normal_pci(_decode(_try(nv, "nvmlDeviceGetPciInfo", h).busId)),
        "pcie": {k: _try(nv, f, h) for k, f in (
            ("gen", "nvmlDeviceGetCurrPcieLinkGeneration"), ("max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
            ("width", "nvmlDeviceGetCurrPcieLinkWidth"), ("max_width", "nvmlDeviceGetMaxPcieLinkWidth"))},
        "pcie_replay_counter": _try(nv, "nvmlDeviceGetPcieReplayCounter", h),
        "temperature_c": _try(nv, "nvmlDeviceGetTemperature", h, 0),
    }
    if hasattr(nv, "nvmlDeviceGetMarginTemperature"):
        margin = _try(nv, "nvmlDeviceGetMarginTemperature", h)
        out["thermal_margin_c"] = getattr(margin, "margin", margin)
    reasons = _try(nv, "nvmlDeviceGetCurrentClocksEventReasons", h)
    if not isinstance(reasons, int):
        reasons = _try(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", h)  # older bindings
    out["clock_event_reasons"] = {"raw": hex(reasons) if isinstance(reasons, int) else reasons,
                                  "slowdowns": [n for bit, n in CLOCK_EVENT_REASONS.items()
                                                if isinstance(reasons, int) and reasons & bit]}
    links = []
    for link in range(18):
        state = _try(nv, "nvmlDeviceGetNvLinkState", h, link)
        if isinstance(state, str):  # past the last link (INVALID_ARGUMENT) or no NVLink
            break
        remote = _try(nv, "nvmlDeviceGetNvLinkRemotePciInfo_v2", h, link)
        if isinstance(remote, str):
            remote = _try(nv, "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        links.append({"link": link, "active": bool(state),
                      "remote": normal_pci(_decode(remote.busId)) if hasattr(remote, "busId") else remote})
    out["nvlinks"] = links
    out["gpm"] = gpm(nv, h, gpm_seconds)
    return out


def gpm(nv: Any, h: Any, seconds: float) -> dict[str, Any]:
    if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
        return {"supported": "binding has no GPM"}
    sup = _try(nv, "nvmlGpmQueryDeviceSupport", h)
    if not getattr(sup, "isSupportedDevice", False):
        return {"supported": False}
    a, b = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    try:
        nv.nvmlGpmSampleGet(h, a)
        time.sleep(seconds)
        nv.nvmlGpmSampleGet(h, b)
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.sample1, mg.sample2, mg.numMetrics = a, b, len(GPM_METRICS)
        for i, metric in enumerate(GPM_METRICS):
            mg.metrics[i].metricId = metric
        nv.nvmlGpmMetricsGet(mg)
        return {GPM_METRICS[mg.metrics[i].metricId][0]: round(mg.metrics[i].value / 100, 4)
                for i in range(len(GPM_METRICS))}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        nv.nvmlGpmSampleFree(a)
        nv.nvmlGpmSampleFree(b)


def nvidia_smi_topo() -> dict[str, dict[str, str]] | str:
    """``nvidia-smi topo -m`` as {row: {column: cell}} (GPU and NIC cells only)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi not found"
    r = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return f"nvidia-smi topo -m exited {r.returncode}: {r.stderr.strip()[:200]}"
    lines = [ln.replace("\x1b[4m", "").replace("\x1b[0m", "") for ln in r.stdout.splitlines() if ln.strip()]
    header = lines[0].split()
    cols = [c for c in header if c.startswith(("GPU", "NIC", "mlx"))]
    out: dict[str, dict[str, str]] = {}
    for ln in lines[1:]:
        parts = ln.split()
        if not parts or not parts[0].startswith(("GPU", "NIC", "mlx")):
            continue
        out[parts[0]] = dict(zip(cols, parts[1:1 + len(cols)], strict=False))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host-root", default="/", help="host root the collectors read (default /)")
    ap.add_argument("--gpm-seconds", type=float, default=2.0, help="GPM sampling interval (default 2)")
    ap.add_argument("--out", help="also write the whole report as JSON here")
    args = ap.parse_args(argv)
    nv, why = load_nvml()
    if nv is None:
        print(f"NVML does not load here ({why}): run this on a GPU node", file=sys.stderr)
        return EX_UNAVAILABLE
    report: dict[str, Any] = {"driver": _decode(_try(nv, "nvmlSystemGetDriverVersion")), "gpus": []}
    view = probe_nvml(nv)  # what the topology collector reads: NVLink remotes, utilisation, fabric state
    for i in range(nv.nvmlDeviceGetCount()):
        g = gpu_readings(nv, nv.nvmlDeviceGetHandleByIndex(i), args.gpm_seconds)
        g["fabric"] = view.fabric.get(g["bus_id"])  # (state, NVML return); NVSwitch systems only
        g["utilization_pct"] = view.utilization.get(g["bus_id"])
        report["gpus"].append(g)
        print(f"GPU{i} {g['name']} {g['bus_id']}: PCIe Gen{g['pcie']['gen']}/{g['pcie']['max_gen']} "
              f"x{g['pcie']['width']}/{g['pcie']['max_width']}, replays {g['pcie_replay_counter']}, "
              f"{sum(link['active'] for link in g['nvlinks'])}/{len(g['nvlinks'])} NVLinks up, "
              f"reasons {g['clock_event_reasons']}, {g['temperature_c']} C margin {g.get('thermal_margin_c')}, "
              f"fabric {g.get('fabric')}, GPM {g['gpm']}")
    topo, notes = topology_report(args.host_root, use_nvml=True)
    report["topology"], report["topology_notes"] = topo, notes
    print("\n# gpu-node-agent topo\n" + render_text(topo))
    smi = nvidia_smi_topo()
    report["nvidia_smi_topo"] = smi
    if isinstance(smi, dict):
        ours = topo.get("matrix", {})
        diffs = [f"{r}/{c}: nvidia-smi {v}, ours {ours.get(r, {}).get(c)}"
                 for r, row in smi.items() for c, v in row.items() if r != c and ours.get(r, {}).get(c) != v]
        report["topology_differences"] = diffs
        print(f"\n# compared with nvidia-smi topo -m: {len(diffs)} differing cells")
        for d in diffs:
            print("  " + d)
    else:
        print(f"\n# nvidia-smi topo -m: {smi}")
    (check,) = asyncio.run(check_roots([args.host_root]))
    report["check"] = {k: check.get(k) for k in ("status", "conditions", "events", "skipped")}
    print(f"\n# gpu-node-agent check: {check['status']}")
    for m in [*check["conditions"], *check["events"]]:
        if m["collector"] in ("nvml", "topology", "gpu_devices", "kernel_modules"):
            print(f"  [{m['severity']:8}] {m['collector']} {m['type']} {m['entity']}: {m['message'][:160]}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
