"""Verdict ``hardware`` (fleet/correlator.py VERDICT_RULES, priority 1, published at once): a critical finding of
a node's own collector on a GPU or NIC port one of the job's ranks used names that node, the device and the
rank; a fault on a device no rank used, a fault on too many nodes, a counter rate extrapolated from a few
seconds, and a tenant's log line standing alone or against its node's own finding do not decide it."""

from __future__ import annotations

from typing import Any

from tests.verdict_evidence import finding, incident, member, not_by, rule_says, said, timeout, verdict

SIZE = 4  # n0: ranks 0-1, n1: ranks 2-3 (rank r on GPU 0000:(18+r):00.0 and rail mlx5_r/1)


def _job(nodes: int = 2) -> list[dict[str, Any]]:
    per = SIZE // 2
    return [member(f"n{r // per}", r, per * nodes) for r in range(per * nodes)]


def test_a_gpu_a_rank_used_fell_off_the_bus_names_its_node_at_once() -> None:
    msgs = [*_job(), finding("n1", "kmsg_xid", "GPUFellOffBus", "gpu:0000:1b:00.0", text="Xid 79")]
    v = verdict(msgs)
    assert rule_says(v, "hardware") == {"node": "n1", "entity": "gpu:0000:1b:00.0", "kind": "gpu", "rank": "3"}
    inc = incident(msgs)
    assert inc is not None and inc.actionable and inc.corroboration == "own node" and inc.victims == ["n0"]


def test_a_port_a_rank_used_went_down_names_the_port_and_its_rank() -> None:
    msgs = [*_job(), finding("n0", "infiniband", "IBPortDown", "ib:mlx5_1/1", state="DOWN")]
    assert rule_says(verdict(msgs), "hardware") == {"node": "n0", "entity": "ib:mlx5_1/1", "kind": "hca_port",
                                                    "rank": "1"}


def test_a_fault_on_a_device_no_rank_used_decides_nothing() -> None:
    """Near miss: the same node's unused GPU and its storage NIC."""
    for fault in (finding("n1", "kmsg_xid", "GPUFellOffBus", "gpu:0000:2a:00.0", text="Xid 79"),
                  finding("n1", "infiniband", "IBPortDown", "ib:mlx5_8/1", state="DOWN")):
        assert verdict([*_job(), fault]) is None


def test_a_resolved_fault_and_a_warning_decide_nothing() -> None:
    gpu = "gpu:0000:1b:00.0"
    assert verdict([*_job(), finding("n1", "kmsg_xid", "GPUFellOffBus", gpu, text="x"),
                    finding("n1", "kmsg_xid", "GPUFellOffBus", gpu, severity="info", status="resolved")]) is None
    assert verdict([*_job(), finding("n1", "nvml", "GPUThermalSlowdown", gpu, severity="warning")]) is None


def test_faults_on_more_than_two_of_the_job_s_nodes_are_the_fabric_s() -> None:
    """Near miss: a port down under a rank on each of three nodes names nobody (the evidence is kept)."""
    msgs = _job(nodes=3) + [finding(f"n{i}", "infiniband", "IBPortDown", f"ib:mlx5_{2 * i}/1", state="DOWN")
                            for i in range(3)]
    v = verdict(msgs)
    assert v is not None and v.rule == "hardware" and v.culprit is None and len(v.deciding) == 3, v


def _counters(full_window: Any, node: str = "n1", port: str = "mlx5_2/1") -> dict[str, Any]:
    return finding(node, "infiniband", "IBErrorCountersIncreasing", f"ib:{port}", counters=[
        {"counter": "symbol_error", "delta": 40, "last_hour": 400, "rate_per_hour": 400.0, "full_window": full_window,
         "severity": "critical", "rule": "> 100/hour", "window_s": 3600}])


def test_error_counters_decide_only_over_a_full_window() -> None:
    """Near miss: a rate extrapolated from a short window (or a window the node did not say was full) is no
    hardware evidence; over a full window, before the job is hit, it names the port but is not acted on."""
    assert verdict([*_job(), _counters(False)]) is None
    assert verdict([*_job(), _counters("yes")]) is None  # not the boolean the node writes
    culprit = rule_says(verdict([*_job(), _counters(True)]), "hardware")
    assert culprit == {"node": "n1", "entity": "ib:mlx5_2/1", "kind": "hca_port", "rank": "2"}
    inc = incident([*_job(), _counters(True)])
    assert inc is not None and not inc.actionable and inc.confidence == 0.8


def _async(node: str, rank: int, hca: str, severity: str = "critical") -> dict[str, Any]:
    return said(node, rank, SIZE, "NCCLIBAsyncEvent", severity, hca=hca, port=1, event="port error")


def test_a_tenant_log_line_alone_names_the_port_but_is_never_acted_on() -> None:
    """NCCL saw the port fail under a rank (its log: the tenant's word): the port is named, below the cordon."""
    msgs = [*_job(), _async("n1", 2, "mlx5_2")]
    assert rule_says(verdict(msgs), "hardware") == {"node": "n1", "entity": "ib:mlx5_2/1", "kind": "hca_port",
                                                    "rank": "2"}
    inc = incident(msgs)
    assert inc is not None and not inc.actionable and inc.confidence == 0.8 and "own log" in inc.reason
    assert verdict([*_job(), _async("n1", 2, "mlx5_2", severity="warning")]) is None  # a benign event


def test_the_port_s_own_node_outranks_the_tenant_s_log_line() -> None:
    """Near miss for the tenant's word: the node's own collector says another of the job's ports is down; its
    finding decides, the log line's port is not the culprit."""
    msgs = [*_job(), _async("n1", 2, "mlx5_2"), finding("n1", "infiniband", "IBPortDown", "ib:mlx5_3/1", state="DOWN")]
    assert rule_says(verdict(msgs), "hardware") == {"node": "n1", "entity": "ib:mlx5_3/1", "kind": "hca_port",
                                                    "rank": "3"}
    inc = incident(msgs)
    assert inc is not None and inc.actionable and "own log" not in inc.reason


def test_the_hardware_verdict_comes_before_the_job_s_symptoms() -> None:
    """Priority: with every rank but the GPU's timed out, the fault still decides (not hung_rank)."""
    msgs = [*_job(), finding("n1", "kmsg_xid", "GPUFellOffBus", "gpu:0000:1b:00.0", text="Xid 79"),
            *(timeout(f"n{r // 2}", r, SIZE, 40) for r in range(3))]
    assert rule_says(verdict(msgs), "hardware")["rank"] == "3"
    not_by(verdict(msgs[:SIZE] + msgs[SIZE + 1:]), "hardware")
