"""Lint the environments of running NCCL jobs (/proc/<pid>/environ under the host root).

Only processes whose environment mentions NCCL_ are considered; the scan is bounded per pass
and permission errors are counted, not fatal. Each finding is an ``NCCLEnvMisconfigured``
condition per (process, variable), resolved when the process is gone or the value is fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, ClassVar

from collectors.formats.ib_sysfs import parse_enum
from collectors.nccl.hca_names import exact_hca_value, natural_key
from collectors.nccl.rank_paths import nccl_ladder, parse_gdr_level
from gna_sdk import CollectorSettings, Emitter, HostPaths, Severity
from gna_types.network_details import NCCLEnvMisconfigured
from gna_types.node_details import wire
from gna_types.policy import verdict

IB_TIMEOUT_DEFAULT = 20  # NCCL >= 2.23 (18 before, 14 earlier)


class NCCLEnvConfig(CollectorSettings, kw_only=True, forbid_unknown_fields=True):
    interval: float = 60.0
    max_processes: int = 4096  # /proc entries looked at per pass
    max_environ_bytes: int = 1 << 20
    min_ib_timeout: int = IB_TIMEOUT_DEFAULT  # below this on a large fabric: a warning


def parse_environ(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.startswith(b"NCCL_"):
            out[key.decode("ascii", "replace")] = value.decode("utf-8", "replace")
    return out


JOB_NET_CHOICES = ("NCCL_IB_DISABLE", "NCCL_NET")


def hca_prefix_overmatch(value: str, hcas: list[str]) -> dict[str, list[str]]:
    """NCCL_IB_HCA entries (no leading '=') that select more than one present HCA."""
    if not value or value.startswith(("=", "^")):
        return {}
    out = {}
    for entry in value.split(","):
        name = entry.split(":")[0].strip()
        if not name:
            continue
        hits = [h for h in hcas if h.startswith(name)]
        if len(hits) > 1:
            out[name] = hits
    return out


def ifname_matches(value: str, ifaces: list[str]) -> list[str]:
    """Interfaces NCCL_SOCKET_IFNAME selects: prefixes, '=' exact, '^' excludes (NCCL's rules)."""
    if not value:
        return ifaces
    exclude = value.startswith("^")
    spec = value[1:] if exclude else value
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    names = [s.split(":")[0] for s in spec.split(",") if s]
    hit = [i for i in ifaces if any((i == n) if exact else i.startswith(n) for n in names)]
    return [i for i in ifaces if i not in hit] if exclude else hit


def lint(env: dict[str, str], *, hcas: list[str], active_ib: bool, ifaces: list[str],
         min_ib_timeout: int) -> list[tuple[str, Severity, str, str, dict[str, Any]]]:
    """(variable, severity, reason, message, details) for each finding; the severity is the policy table's
    (gna_types.policy NCCL_FINDINGS, ``NCCLEnvMisconfigured``)."""
    out: list[tuple[str, str, str, dict[str, Any]]] = []
    v = env.get("NCCL_IB_HCA")
    if v is not None and (over := hca_prefix_overmatch(v, hcas)):
        exact = exact_hca_value(v, hcas)
        out.append(("NCCL_IB_HCA", "PrefixMatch",
                    f"NCCL_IB_HCA={v} is a prefix match selecting "
                    f"{sorted({h for hs in over.values() for h in hs}, key=natural_key)}; set NCCL_IB_HCA to "
                    f"'{exact}' to name them exactly.", {"value": v, "matches": over, "exact": exact}))
    if "NCCL_IB_GID_INDEX" in env:
        out.append(("NCCL_IB_GID_INDEX", "SetByHand",
                    f"NCCL_IB_GID_INDEX={env['NCCL_IB_GID_INDEX']} is set by hand; NCCL >= 2.21 selects the GID "
                    f"itself and a fixed index breaks on nodes whose GID table differs.",
                    {"value": env["NCCL_IB_GID_INDEX"]}))
    v = env.get("NCCL_NET_GDR_LEVEL")
    if v is not None:
        # as ncclGetLevel (src/graph/paths.cc, 2.6-2.30) reads it: an exact, case-sensitive name of the ladder,
        # else a legacy integer, else ignored; the job's NCCL version is not in its environment, so the newest
        # ladder applies here (nccl_logs judges it again with the version and the rank's GPU and NIC)
        gdr = parse_gdr_level(v, None)
        names = [n for n in nccl_ladder(None) if n not in ("NVL", "NVB", "C2C", "LOC")]
        info = {"value": v[:200], "valid": names, "parsed_as": gdr.form, "effective_level": gdr.effective,
                "note": gdr.note}
        if gdr.form == "integer":
            out.append(("NCCL_NET_GDR_LEVEL", "IntegerLevel",
                        f"NCCL_NET_GDR_LEVEL={v[:60]} is a legacy integer ({gdr.note}); the numbers NCCL logs as "
                        f"'distance %d' are path types that moved with each release: write the name "
                        f"({', '.join(names)}).", info))
        elif gdr.form == "ignored":
            out.append(("NCCL_NET_GDR_LEVEL", "InvalidLevel",
                        f"NCCL_NET_GDR_LEVEL={v[:60]!r} is not a level NCCL reads ({gdr.note}): it keeps its default "
                        f"{gdr.effective}; use one of {', '.join(names)}.", info))
    v = env.get("NCCL_IB_TIMEOUT")
    if v is not None:
        try:
            t = int(v)
        except ValueError:
            t = -1
        if t < min_ib_timeout:
            out.append(("NCCL_IB_TIMEOUT", "TooShort",
                        f"NCCL_IB_TIMEOUT={v} is below {min_ib_timeout} (4.096 us x 2^{min_ib_timeout} ~ 4.3 s): on a "
                        f"large fabric transient congestion becomes retry-exceeded errors.",
                        {"value": v, "default": IB_TIMEOUT_DEFAULT}))
    v = env.get("NCCL_IB_RETRY_CNT")
    if v is not None and not (v.strip().isdigit() and 0 <= int(v) <= 7):
        out.append(("NCCL_IB_RETRY_CNT", "OutOfRange", f"NCCL_IB_RETRY_CNT={v} is outside 0-7.",
                    {"value": v}))
    v = env.get("NCCL_SOCKET_IFNAME")
    if v is not None and ifaces and not ifname_matches(v, ifaces):
        out.append(("NCCL_SOCKET_IFNAME", "NoSuchInterface",
                    f"NCCL_SOCKET_IFNAME={v} selects no interface on this node ({', '.join(ifaces)}): bootstrap "
                    f"will hang or use the wrong network.", {"value": v, "interfaces": ifaces}))
    if env.get("NCCL_IB_DISABLE", "").strip() == "1" and active_ib:
        out.append(("NCCL_IB_DISABLE", "IBDisabledOnIBNode",
                    "NCCL_IB_DISABLE=1 on a node with ACTIVE IB/RoCE ports: NCCL will use TCP sockets.",
                    {"value": "1"}))
    level = env.get("NCCL_DEBUG", "").strip().upper()
    if level in ("", "WARN", "VERSION"):
        out.append(("NCCL_DEBUG", "FallbackInvisible",
                    f"NCCL_DEBUG is {level or 'unset'}: an IB-to-socket fallback or missing GPUDirect RDMA is "
                    f"invisible; set NCCL_DEBUG=INFO with NCCL_DEBUG_FILE=/var/log/nccl/%h.%p.log.",
                    {"value": level or None}))
    graded: list[tuple[str, Severity, str, str, dict[str, Any]]] = []
    for var, reason, message, details in out:
        graded.append((var, verdict("NCCLEnvMisconfigured", reason).severity, reason, message, details))
    return graded


class NCCLEnvCollector:
    name: ClassVar[str] = "nccl_env"
    config_type: ClassVar[type[NCCLEnvConfig]] = NCCLEnvConfig
    phase: ClassVar[int] = 35  # before nccl_logs (which uses the NCCL_IB_HCA values)

    def __init__(self, config: NCCLEnvConfig, host: HostPaths, emit: Emitter) -> None:
        self.config = config
        self.host = host
        self.emit = emit
        self.skipped = 0

    def _scan(self) -> tuple[dict[int, dict[str, str]], list[str], bool, list[str]]:
        procs: dict[int, dict[str, str]] = {}
        proc = self.host.path("/proc")
        try:
            pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())[: self.config.max_processes]
        except OSError:
            pids = []
        for pid in pids:
            try:
                with open(proc / str(pid) / "environ", "rb") as fh:
                    data = fh.read(self.config.max_environ_bytes)
            except OSError:  # EACCES, or the process just ended
                self.skipped += 1
                continue
            if b"NCCL_" in data:
                env = parse_environ(data)
                if env:
                    procs[pid] = env
        hcas, active = [], False
        with contextlib.suppress(OSError):
            for hca in sorted(self.host.path("/sys/class/infiniband").iterdir()):
                hcas.append(hca.name)
                for port in (hca / "ports").iterdir():
                    st = parse_enum(self.host.read_text(f"/sys/class/infiniband/{hca.name}/ports/{port.name}/state"))
                    active = active or bool(st and st[0] in (4, 5))
        try:
            ifaces = sorted(os.listdir(self.host.path("/sys/class/net")))
        except OSError:
            ifaces = []
        return procs, hcas, active, ifaces

    async def collect(self) -> None:
        procs, hcas, active, ifaces = await asyncio.to_thread(self._scan)
        self.emit.facts.set("nccl_env.ib_hca", {str(p): e["NCCL_IB_HCA"] for p, e in procs.items()
                                                if "NCCL_IB_HCA" in e})
        # the value as the job wrote it (its log echoes only what NCCL made of it): nccl_logs' NCCLGDRLevel
        self.emit.facts.set("nccl_env.gdr_level", {str(p): e["NCCL_NET_GDR_LEVEL"] for p, e in procs.items()
                                                   if "NCCL_NET_GDR_LEVEL" in e})
        # the job's own transport choices: nccl_logs then calls a socket fallback a job setting, not a node fault
        self.emit.facts.set("nccl_env.net_choice", {str(p): {k: e[k] for k in JOB_NET_CHOICES if k in e}
                                                    for p, e in procs.items() if any(k in e for k in JOB_NET_CHOICES)})
        for pid, env in procs.items():
            for var, severity, reason, message, details in lint(env, hcas=hcas, active_ib=active, ifaces=ifaces,
                                                                min_ib_timeout=self.config.min_ib_timeout):
                await self.emit.condition(
                    "NCCLEnvMisconfigured", firing=True, severity=severity, entity=f"proc:{pid}/{var}",
                    reason=reason, message=f"Process {pid}: {message}",
                    details=wire(NCCLEnvMisconfigured(pid=pid, variable=var, **details)),
                    suggested_action=verdict("NCCLEnvMisconfigured", reason).action)
