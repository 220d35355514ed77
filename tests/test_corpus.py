"""Real inputs no one here wrote: verbatim excerpts of logs, kernel logs and JuiceFS `.stats` from public
issues and other projects' test data (each case's source.txt), run through `check` on a simulated HGX node
(8 GPUs with NVLink, 8 ACTIVE InfiniBand ports, GPUDirect RDMA available), against the verdict an expert
expects (expect.json: what must fire, at what severity and with what action; what must not fire).

Layout: tests/corpus/<family>/<case>/{source.txt,input.log,where.txt,expect.json}.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from agent import config as configmod
from agent.check import run_check
from collectors.formats.juicefs_files import parse_stats
from sim.host import SimHost

CORPUS = Path(__file__).parent / "corpus"
LOUD = frozenset({"warning", "critical"})  # the severities that ask an operator to look
CASES = sorted(p for p in CORPUS.glob("*/*") if (p / "expect.json").is_file())


def _run(case: Path, tmp: Path) -> list[dict[str, Any]]:
    host = SimHost.gpu_node(tmp / "host", gpus=8, hcas=8)
    where = (case / "where.txt").read_text().strip()
    data = (case / "input.log").read_bytes()
    if where.endswith(".stats"):
        # the cache dir lies on this test machine's disk, not the input's node: the smallest cache that is no
        # MiB-for-GiB mistake (1 GiB) and no free-space ratio, so that disk's space is never graded as the input's
        host.add_juicefs(where.rsplit("/", 1)[0], "/var/jfsCache", cache_size=1 << 30, free_space=0.0)
    if where == "/dev/kmsg":
        # the capture was taken soon after its newest record: `check` looks back lookback_seconds (600 s
        # by default) from the node's uptime, as on the node the log came from
        stamps = [float(m.group(1)) for m in re.finditer(rb"\[\s*(\d+\.\d+)\]", data)]
        if stamps:
            host.set_boot("corpus", uptime=max(stamps) + 60)
    dest = host.p(where)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    # a real input copied here to be checked: its lines are this node's whatever host they name (own_hosts)
    cfg = configmod.parse(f'node = "corpus"\nhost_root = "{host.root}"\n[collectors.nccl_logs]\nnvlink = "yes"\n'
                          'own_hosts = ["*"]\n', file="<corpus>")
    report = asyncio.run(run_check(cfg))
    return [*report["conditions"], *report["events"]]


def test_the_corpus_is_there() -> None:
    assert len(CASES) >= 40, f"{len(CASES)} real-input cases"
    for case in CASES:
        source = (case / "source.txt").read_text().strip()
        assert source and ("#" in source or "@" in source or "http" in source), case


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_real_input_gets_the_expert_verdict(case: Path, tmp_path: Path) -> None:
    expect = json.loads((case / "expect.json").read_text())
    got = _run(case, tmp_path)
    seen = [(m["type"], m["severity"], m["suggested_action"]) for m in got]
    for want in expect.get("must", []):
        assert any(t == want["type"] and s == want["severity"] and a == want.get("action", a) for t, s, a in seen), (
            f"{case.name}: expected {want}, got {seen} ({expect.get('why', '')})")
    unwanted = {t for t, _s, _a in seen} & set(expect.get("must_not", []))
    assert not unwanted, f"{case.name}: must not fire {unwanted} ({expect.get('why', '')}); got {seen}"
    if not expect.get("must"):
        # a healthy case: nothing an operator is asked to look at fires, whatever its type (a hand-picked
        # must_not list would hide a false positive of a type nobody thought of)
        loud = [m for m in got if m["severity"] in LOUD]
        assert not loud, f"{case.name}: healthy, yet {[(m['type'], m['severity'], m.get('reason')) for m in loud]}"
    assert not any(a == "cordon" and t.startswith("NCCL") for t, _s, a in seen), "a job's log never cordons"
    if "stats_values" in expect:
        values = parse_stats((case / "input.log").read_text(errors="replace")).values
        for name, value in expect["stats_values"].items():
            assert values.get(name) == pytest.approx(float(value)), (name, values.get(name))
