"""Recorded bench results (bench/record.py, issue 27): a figure cannot outlive the code it measured.

Every bench declared in bench/record.py MEASURES must have a newest result per variant whose fingerprint
matches the code the checkout holds now; docs/benchmarks.md's generated section must be what the results
render. The fingerprint itself is tested: comments and docstrings leave it, code changes move it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Benches declared but not yet re-run since recording began: each must leave this list (the test says so)
# once its result is recorded; none may join it.
NOT_YET_RECORDED: frozenset[str] = frozenset()


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_record", ROOT / "bench" / "record.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_record", mod)
    spec.loader.exec_module(mod)
    return mod


record = _load()


@pytest.mark.parametrize("bench", sorted(record.MEASURES))
def test_each_benchs_newest_result_measured_the_code_here(bench: str) -> None:
    why = record.staleness([bench])[bench]
    if bench in NOT_YET_RECORDED:
        assert why, f"{bench} has a current result now: take it out of NOT_YET_RECORDED"
        pytest.skip(f"{bench}: not recorded yet ({why})")
    assert not why, f"bench/{bench}.py: {why}"


def test_every_bench_that_records_is_declared_and_every_declared_bench_exists() -> None:
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")}
    assert set(record.MEASURES) <= scripts
    for p in (ROOT / "bench").glob("*.py"):
        if p.stem != "record" and "results.record(" in p.read_text():
            assert p.stem in record.MEASURES, f"{p.name} records results but declares no measured code"


def test_the_docs_section_is_what_the_results_render() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert record.BEGIN in text and record.END in text, "run .venv/bin/python bench/record.py --docs"
    assert record.docs_text(text) == text, "docs/benchmarks.md is behind bench/results: bench/record.py --docs"


def test_the_fingerprint_ignores_comments_and_docstrings_and_sees_code(tmp_path: Path) -> None:
    a = tmp_path / "a.py"
    a.write_text('"""Doc."""\n\ndef f(x):\n    """Say."""\n    return x + 1  # one\n')
    base = record._digest(a)
    a.write_text('"""Another doc."""\n# a comment\n\ndef f(x):\n    return (x +\n            1)\n')
    assert record._digest(a) == base
    a.write_text('"""Doc."""\n\ndef f(x):\n    return x + 2\n')
    assert record._digest(a) != base
    b = tmp_path / "b.toml"
    b.write_text("x = 1\n")
    assert record._digest(b) == b"x = 1\n"
    c = tmp_path / "c.py"
    c.write_text("def (:\n")  # does not parse: its bytes
    assert record._digest(c) == b"def (:\n"


def test_a_recorded_result_goes_stale_when_its_code_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "hot.py").write_text("def f():\n    return 1\n")
    (tmp_path / "pkg" / "cold.py").write_text("def g():\n    return 1\n")
    (tmp_path / "bench" / "toy.py").write_text("print('toy')\n")
    monkeypatch.setattr(record, "REPO", tmp_path)
    monkeypatch.setattr(record, "RESULTS", tmp_path / "bench" / "results")
    monkeypatch.setattr(record, "MEASURES", {"toy": ("pkg/hot.py",)})
    assert record.staleness(["toy"]) == {"toy": "no recorded result"}
    r = record.record("toy", [record.figure("speed", 10.0, "MB/s", baseline=5.0, baseline_name="grep"),
                              record.figure("latency", 2.0, "ms", baseline=4.0, higher_is_better=False)],
                      variant="small", params={"mb": 1})
    assert [f["ratio"] for f in r["figures"]] == [2.0, 2.0]
    line = json.loads((tmp_path / "bench" / "results" / "toy.jsonl").read_text().splitlines()[-1])
    assert {"bench", "variant", "date", "commit", "dirty", "fingerprint", "command", "machine", "params",
            "figures"} <= set(line)
    assert line["machine"]["cpus"] >= 1
    assert record.staleness(["toy"]) == {"toy": ""}
    (tmp_path / "pkg" / "cold.py").write_text("def g():\n    return 2\n")  # not measured: still current
    (tmp_path / "pkg" / "hot.py").write_text("# why\ndef f():\n    return 1\n")  # a comment: still current
    assert record.staleness(["toy"]) == {"toy": ""}
    (tmp_path / "pkg" / "hot.py").write_text("def f():\n    return 2\n")
    why = record.staleness(["toy"])["toy"]
    assert "changed" in why and "small" in why and "re-run" in why
    (tmp_path / "bench" / "toy.py").write_text("print('toy', 2)\n")  # the bench script itself is measured too
    record.record("toy", [record.figure("speed", 9.0)], variant="small")
    assert record.staleness(["toy"]) == {"toy": ""}
    with pytest.raises(KeyError):
        record.record("undeclared", [])


def test_the_generated_section_renders_each_variants_newest_result(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "toy.py").write_text("pass\n")
    monkeypatch.setattr(record, "REPO", tmp_path)
    monkeypatch.setattr(record, "RESULTS", tmp_path / "bench" / "results")
    monkeypatch.setattr(record, "MEASURES", {"toy": ()})
    record.record("toy", [record.figure("speed", 1.0, "MB/s")], variant="a")
    record.record("toy", [record.figure("speed | <b>", 2.5, "MB/s", baseline=1.25, baseline_name="grep")],
                  variant="a")
    record.record("toy", [record.figure("speed", 7.0, "MB/s")], variant="b")
    doc = record.docs_text("# Benchmarks\n\nintro\n\n## First\n\ntext\n")
    assert doc.index("intro") < doc.index(record.BEGIN) < doc.index("## First")
    section = doc[doc.index(record.BEGIN):doc.index(record.END)]
    assert "### toy (a)" in section and "### toy (b)" in section
    assert "| 2.5 MB/s | 1.25 MB/s (grep) | 2.00x |" in section and "| 1 MB/s" not in section
    assert "speed \\| <b>" in section  # a cell cannot break the table
    assert record.docs_text(doc) == doc  # regenerating an up-to-date document changes nothing


def test_the_measured_code_is_what_the_declared_files_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bench's files are its declared ones and every project module they import, transitively (function-level
    and relative imports included, each package's __init__ on the way); a module nothing measured imports is not."""
    for rel, text in {
        "gna_sdk/__init__.py": "from gna_sdk.retry import delay\n",
        "gna_sdk/retry.py": "import json\ndef delay(): return 1\n",
        "gna_sdk/unrelated.py": "X = 1\n",
        "agent/__init__.py": "",
        "agent/emitter.py": "from . import facts\ndef f():\n    from gna_types.policy import SEVERITIES\n",
        "agent/facts.py": "import gna_sdk\n",
        "gna_types/__init__.py": "",
        "gna_types/policy.py": "SEVERITIES = ()\n",
        "bench/x.py": "import record\nfrom agent.emitter import f\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.setattr(record, "REPO", tmp_path)
    monkeypatch.setitem(record.MEASURES, "x", ("agent/emitter.py",))
    files = {p.relative_to(tmp_path).as_posix() for p in record._files("x")}
    assert files == {"bench/x.py", "agent/__init__.py", "agent/emitter.py", "agent/facts.py", "gna_sdk/__init__.py",
                     "gna_sdk/retry.py", "gna_types/__init__.py", "gna_types/policy.py"}
    before = record.fingerprint("x")
    (tmp_path / "gna_sdk/unrelated.py").write_text("X = 2\n")
    assert record.fingerprint("x") == before, "a module nothing measured imports does not stale a figure"
    (tmp_path / "gna_sdk/retry.py").write_text("import json\ndef delay(): return 2\n")
    assert record.fingerprint("x") != before, "a change in an imported module does"
