"""Golden NCCL logs, one per version family (2.18, 2.21, 2.26, 2.28, 2.30), through `check`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from collectors.nccl.line import parse_line
from collectors.nccl.matching import match_line
from collectors.nccl.prefilter import candidate_lines
from collectors.nccl.rules import RULES
from sim.host import SimHost
from tests.conftest import AGENT_CMD, validate_message

GOLDEN = Path(__file__).parent / "golden" / "nccl"
# file -> the NCCL_DEBUG_FILE name it gets (%h.%p.log) and the messages it must produce:
# (type, kind/status, severity, a detail that must hold)
EXPECTED: dict[str, tuple[str, list[tuple[str, str, str, dict[str, object]]]]] = {
    "2.18.log": ("node-a.1234.log", [
        ("NCCLNoGDRDMA", "firing", "warning", {"channels_without_gdrdma": 2}),
        ("NCCLIBCompletionError", "event", "critical", {"status": 12, "vendor_err": 129, "peer": "10.0.0.9<33092>"}),
    ]),
    "2.21.log": ("node-b.4321.log", [
        # no IB device visible to the job on a node whose ports are up: the job's container, not the node
        ("NCCLSocketFallback", "firing", "warning", {"ib_no_device": True, "net": "Socket"}),
        ("NCCLSocketError", "event", "warning", {"error": "Connect to 10.0.0.7<43221> failed"}),
        ("NCCLSocketError", "event", "warning", {"error": "Connection closed by remote peer"}),
        ("NCCLSocketError", "event", "warning", {"error": "Connection closed by remote peer"}),
    ]),
    "2.26.log": ("node-c.777.log", [
        ("NCCLHCASelection", "firing", "warning", {"unintended": ["mlx5_10", "mlx5_11"], "nccl_ib_hca": "mlx5_1"}),
        ("NCCLIBCompletionError", "event", "warning", {"status": 4, "vendor_err": 81, "hca": "mlx5_1",
                                                       "nccl_time": "2026-03-03 12:11:38"}),
        # GPU0 (18:00.0) shares its PCIe switch with mlx5_0 (and mlx5_8) on the simulated node; the job's
        # NCCL_IB_HCA=mlx5_1 leaves it the NODE-far NICs
        ("NCCLFarNIC", "firing", "warning", {"nccl_ib_hca": "mlx5_1", "used_distance": "NODE",
                                             "nearest_nics": "['mlx5_0', 'mlx5_8']"}),
    ]),
    "2.28.log": ("node-d.55.log", [
        ("NCCLP2PViaHost", "firing", "warning", {"shm_channels": 2}),
        ("NCCLIBCompletionError", "event", "critical", {"status": 12, "status_name": "IBV_WC_RETRY_EXC_ERR",
                                                        "hca": "mlx5_1"}),
        # GPU1 (2a:00.0) sends on NET/IB/0, mlx5_0 (NODE), though NCCL listed mlx5_1, PIX to it
        ("NCCLFarNIC", "firing", "warning", {"used_nics": "{'mlx5_0': 'NODE'}", "nearest_nics": "['mlx5_1', 'mlx5_9']"}),
    ]),
    "2.30.log": ("node-e.99.log", [
        ("NCCLIBCompletionError", "event", "critical", {"status": 12, "function": "ncclIbCompletionEventProcess"}),
        ("NCCLSocketError", "event", "warning", {"error": "Connection reset by peer"}),
        ("NCCLWarning", "event", "warning", {"count": 1}),
        ("NCCLWarning", "event", "warning", {"count": 2, "aggregated": True}),
        ("NCCLCollectiveTimeout", "event", "critical", {"seq_num": 4712, "op_type": "ALLREDUCE",
                                                        "timeout_ms": 600000, "ran_for_ms": 600081, "pid": 99}),
        # the periodic update is progress only; the failure line is the group's progress when the watchdog fired
        ("NCCLWatchdogProgress", "event", "warning", {"at_seq": 4712, "last_enqueued": 4712, "last_completed": 4711,
                                                       "pg_id": "0", "rank": 2}),
    ]),
}


def _node(tmp: Path) -> SimHost:
    host = SimHost.gpu_node(tmp / "host", gpus=8, hcas=12)  # ACTIVE IB, peermem: GPUDirect available
    host.write("/proc/sys/kernel/hostname", "agent-node\n")
    return host


def _check(host: SimHost, tmp: Path, extra: str = "") -> dict[str, object]:
    cfg = tmp / "c.toml"
    # captured logs name their own hosts: copied here to be checked, every line is this node's (own_hosts)
    cfg.write_text('[collectors.nccl_logs]\nnvlink = "yes"\nown_hosts = ["*"]\n' + extra)
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(host.root), "--config", str(cfg), "--format", "json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1, 2), r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_golden_file(name: str, tmp_path: Path) -> None:
    host = _node(tmp_path)
    target, expected = EXPECTED[name]
    dest = host.p(f"/var/log/nccl/{target}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(GOLDEN / name, dest)
    report = _check(host, tmp_path)
    got = [m for m in [*report["conditions"], *report["events"]]  # type: ignore[misc]
           if m["collector"] == "nccl_logs"]
    for m in got:
        validate_message(m)
    # membership (#15): one info event per communicator a process joined, for the fleet correlator
    members = [m for m in got if m["type"] == "NCCLJobMember"]
    inits = (GOLDEN / name).read_text().count("Init COMPLETE")
    assert len(members) == inits, (len(members), inits)
    assert all(m["severity"] == "info" and m["details"]["comm_id"] and m["details"]["size"] >= 1 for m in members)
    got = [m for m in got if m["type"] != "NCCLJobMember"]
    proj = sorted((m["type"], m["status"] or "event", m["severity"]) for m in got)
    assert proj == sorted((t, s, sev) for t, s, sev, _ in expected), json.dumps(got, indent=1)[:3000]
    for type_, status, _sev, details in expected:
        cands = [m for m in got if m["type"] == type_ and (m["status"] or "event") == status]
        assert any(all(str(m["details"].get(k)) == str(v) or (isinstance(v, str) and v in str(m["details"].get(k)))
                       for k, v in details.items()) for m in cands), (type_, details, cands)
    ent = {m["entity"] for m in got}
    assert ent == {f"nccl:{target.split('.')[0]}:{target.split('.')[1]}"}


def test_fallback_is_only_info_without_active_ib(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=8)  # no HCAs at all
    dest = host.p("/var/log/nccl/node-b.4321.log")
    dest.parent.mkdir(parents=True)
    shutil.copy(GOLDEN / "2.21.log", dest)
    report = _check(host, tmp_path)
    (c,) = [c for c in report["conditions"] if c["type"] == "NCCLSocketFallback"]  # type: ignore[union-attr]
    assert c["severity"] == "info" and c["suggested_action"] == "none" and c["reason"] == "NoRDMAOnNode"


def test_no_gdr_warning_needs_gdr_to_be_available(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "host", gpus=8, hcas=2, peermem=False)
    dest = host.p("/var/log/nccl/node-a.1234.log")
    dest.parent.mkdir(parents=True)
    shutil.copy(GOLDEN / "2.18.log", dest)
    report = _check(host, tmp_path)
    types = {c["type"] for c in report["conditions"]}  # type: ignore[union-attr]
    assert "NCCLNoGDRDMA" not in types  # the node cannot do GDR: kernel_modules reports that instead
    assert "KernelModuleNotLoaded" in types


def test_storage_nic_in_selection(tmp_path: Path) -> None:
    host = _node(tmp_path)
    dest = host.p("/var/log/nccl/node-e.99.log")
    dest.parent.mkdir(parents=True)
    shutil.copy(GOLDEN / "2.30.log", dest)
    report = _check(host, tmp_path, 'storage_hcas = ["mlx5_3"]\n')
    (c,) = [c for c in report["conditions"] if c["type"] == "NCCLHCASelection"]  # type: ignore[union-attr]
    assert c["reason"] == "StorageNIC" and c["details"]["storage_nics"] == ["mlx5_3"]


def test_every_rule_has_a_golden_line() -> None:
    seen = set()
    real = Path(__file__).parent / "corpus" / "nccl"  # the real-input corpus counts too
    for f in [*GOLDEN.glob("*.log"), *real.glob("*/input.log")]:
        data = f.read_bytes()
        for off, raw in candidate_lines(data, 0):
            m = match_line(parse_line(off, raw))
            if m:
                seen.add(m.rule.name)
    assert {r.name for r in RULES} - seen == set(), {r.name for r in RULES} - seen


def test_every_line_a_rule_matches_holds_one_of_that_rule_s_needles() -> None:
    """Issue 23 (2): a rule brings its own prefilter needles (Rule.needles; the prefilter and the bench's grep
    pattern are built from them). Every line of the golden logs and the real corpus that the matcher accepts
    when shown it directly, bypassing the prefilter, holds one of its rule's needles: a rule whose needles miss
    its lines would never fire in the collector, silently."""
    from collectors.nccl.matching import Match, match_or_reject
    from collectors.nccl.prefilter import NEEDLES, grep_pattern
    from collectors.nccl.rules import WARNING_RULE

    real = Path(__file__).parent / "corpus" / "nccl"
    matched = 0
    for f in [*GOLDEN.glob("*.log"), *real.glob("*/input.log")]:
        for raw in f.read_bytes().splitlines():
            m = match_or_reject(parse_line(0, raw))
            if isinstance(m, Match):
                matched += 1
                needles = m.rule.needles or WARNING_RULE.needles
                assert any(n in raw for n in needles), (f.name, m.rule.name, raw[:200])
    assert matched > 100
    assert len(NEEDLES) == len(set(NEEDLES)) and all(r.needles for r in RULES)
    for n in NEEDLES:  # the ERE a bench greps with finds each needle literally
        assert re.search(grep_pattern().encode(), b"x " + n + b" y")
