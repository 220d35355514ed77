"""The culprit of a multi-node job failure, whatever layout the job's logs use (tests/layouts/generate.py).

For each (layout, fault) one seeded scenario is generated (host roots, the operator's config, expected.json) and
``gpu-node-agent diagnose`` runs over it as an operator would run it. Asserted:

(a) no node other than the expected culprit is named a culprit in any incident, and no node is listed with a
    critical finding about another node's processes (a log it read that another node's ranks wrote), nor, when
    it is healthy, with a hardware finding;
(b) the expected culprit node is named (a healthy job: no incident at all).

A scenario the product cannot judge yet FAILS here: nothing is skipped or xfailed. The default run is one small
scenario per cell (2-3 nodes, all cells diagnosed two at a time); ``-m slow`` runs the larger matrix.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.layouts.generate import FAULTS, LAYOUTS, generate
from tests.layouts.verdict import Judgement, judge, run_diagnose

SMALL = [(layout, fault) for layout in LAYOUTS for fault in FAULTS]
LARGE = [(layout, fault, nodes, seed) for layout in LAYOUTS for fault in FAULTS for nodes in (4, 8, 16)
         for seed in (11, 12)]


def _nodes(layout: str, fault: str) -> int:
    return 2 + (LAYOUTS.index(layout) + FAULTS.index(fault)) % 2  # 2 or 3 nodes: both shapes, still fast


def _run(base: Path, layout: str, fault: str, nodes: int, seed: int) -> tuple[dict[str, Any], Judgement]:
    exp = generate(base / f"{layout}-{fault}-{nodes}-{seed}", layout, fault, nodes=nodes, gpus_per_node=8, seed=seed)
    rc, out, err = run_diagnose(exp, timeout=110)
    return exp, judge(exp, rc, out, err)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Judgement]:
    base = tmp_path_factory.mktemp("layouts")
    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        futs = {cell: pool.submit(_run, base, *cell, _nodes(*cell), 3) for cell in SMALL}
        return {cell: f.result()[1] for cell, f in futs.items()}


def _check(j: Judgement) -> None:
    assert not j.error, j.explain()
    # (a) nobody else is blamed, and no node carries another node's findings
    assert not j.wrong, "a node other than the culprit was named:\n" + j.explain()
    assert not j.aliases, "the culprit was named by its pod or host name, not as a node:\n" + j.explain()
    assert not j.misattributed, "a critical finding was filed under a node it is not about:\n" + j.explain()
    assert not j.healthy_flagged, "a healthy node carries a critical hardware finding:\n" + j.explain()
    # (b) the culprit is named; a healthy job is no incident
    if j.expected_node is None:
        assert j.incidents == 0, "a healthy job was reported as an incident:\n" + j.explain()
    else:
        assert j.right, "the culprit node was not named:\n" + j.explain()


@pytest.mark.parametrize(("layout", "fault"), SMALL, ids=[f"{a}-{b}" for a, b in SMALL])
def test_layout(small: dict[tuple[str, str], Judgement], layout: str, fault: str) -> None:
    _check(small[(layout, fault)])


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("layout", "fault", "nodes", "seed"), LARGE,
                         ids=[f"{a}-{b}-{n}n-s{s}" for a, b, n, s in LARGE])
def test_layout_large(tmp_path: Path, layout: str, fault: str, nodes: int, seed: int) -> None:
    _check(_run(tmp_path, layout, fault, nodes, seed)[1])


def test_generator_is_deterministic(tmp_path: Path) -> None:
    a = generate(tmp_path / "a", "slurm-job-label", "crash", nodes=3, seed=5)
    b = generate(tmp_path / "b", "slurm-job-label", "crash", nodes=3, seed=5)
    fa = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    fb = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert fa == fb
    assert all((tmp_path / "a" / p).read_bytes() == (tmp_path / "b" / p).read_bytes() for p in fa)
    assert a["culprit"] == b["culprit"]


def test_judge_reads_the_documented_output() -> None:
    """The judge itself: a wrong node, a pod name for a node, a finding filed under the wrong node."""
    exp = {"layout": "pods-split", "fault": "hang", "seed": 0, "culprit_node": "gpu-a02", "culprit_entity_kind": "rank",
           "hosts": {"job-worker-0": "gpu-a01", "job-worker-1": "gpu-a02", "gpu-a01": "gpu-a01", "gpu-a02": "gpu-a02"}}
    right = {"incidents": [{"job": "0x1", "culprit": {"node": "gpu-a02", "entity": "rank:9", "kind": "rank"},
                            "culprits": [{"node": "gpu-a02", "entity": "rank:9", "kind": "rank"}]}],
             "critical": {"gpu-a01": [{"type": "NCCLCollectiveTimeout", "entity": "nccl:job-worker-0:77",
                                       "details": {"host": "job-worker-0"}}]}}
    assert judge(exp, 2, right).as_expected
    wrong = {"incidents": [{"culprit": {"node": "gpu-a01", "kind": "rank"}, "culprits": []}], "critical": {}}
    assert judge(exp, 2, wrong).wrong == ["gpu-a01"]
    pod = {"incidents": [{"culprit": {"node": "job-worker-1", "kind": "rank"}, "culprits": []}], "critical": {}}
    j = judge(exp, 2, pod)
    assert j.aliases == ["job-worker-1"] and not j.right and j.outcome == "pod-not-node"
    filed = {"incidents": right["incidents"],
             "critical": {"gpu-a01": [{"type": "NCCLCollectiveTimeout", "entity": "nccl:job-worker-1:80"}],
                          "gpu-a03": [{"type": "IBPortDown", "entity": "ib:mlx5_1/1"}]}}
    j = judge(exp, 2, filed)
    assert j.misattributed == ["gpu-a01: NCCLCollectiveTimeout nccl:job-worker-1:80 (about gpu-a02)"]
    assert j.healthy_flagged == ["gpu-a03: IBPortDown ib:mlx5_1/1"]
    assert judge(exp, 64, {}, "usage").error
