"""``dcgmi diag -r <level> -j``: the JSON report, in both layouts DCGM has printed.

* DCGM 3.x (NVIDIA/DCGM v3.3.9, b0ec3c624ea21e688b0d93cf9b214ae0eeb6fe52, dcgmi/Diag.cpp with
  nvvs/include/NvvsJsonStrings.h): ``{"DCGM GPU Diagnostic": {"test_categories": [{"category": ...,
  "tests": [{"name": ..., "results": [{"gpu_id": "<n>", "status": "Pass"|"Fail"|"Skip", "warnings":
  [{"warning": msg, "error_id": n, ...}], "info": "<text>"}]}]}]}}``. The level-one (software) tests put the
  message under ``"warnings"`` inside each warning entry instead of ``"warning"`` (HelperJsonAddBasicTests).
* DCGM 4.x (v4.6.0, 51b65ccebf9d61e6593713a7d6b68e594d9d7975, dcgmi/Diag.cpp HelperJsonBuildOutput,
  testing/python3/dcgm_diag_schema.json): ``{"DCGM Diagnostic": {"test_categories": [{"category": ...,
  "tests": [{"name": ..., "results": [{"entity_group": "GPU", "entity_id": n, "status": ..., "warnings":
  [{"warning": ..., "error_id": ...}], "info": ["..."]}], "test_summary": {"status": ...}}]}]}, ...}``;
  status is one of "Pass", "Fail", "Warn", "Skip", "Not Run" (HelperDisplayDiagResult).

Either layout may instead carry ``"runtime_error": "<why>"`` (dcgmi could not run the diagnostic). A test's
status is its test_summary's, else the worst of its results'. Input is bounded (bytes, tests, results,
messages) and decoded without raising.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MAX_BYTES = 8 << 20
MAX_TESTS = 256
MAX_RESULTS = 1024  # per test: one per GPU (or other entity)
MAX_MESSAGES = 64
MESSAGE_MAX = 500
ROOTS = {"DCGM GPU Diagnostic": "dcgm3", "DCGM Diagnostic": "dcgm4"}
_STATUS = {"pass": "pass", "fail": "fail", "warn": "warn", "skip": "skip", "not run": "not_run"}
_RANK = {"fail": 4, "unknown": 3, "warn": 2, "pass": 1, "skip": 0, "not_run": 0}


@dataclass
class DiagTest:
    category: str
    name: str
    status: str  # pass | fail | warn | skip | not_run | unknown
    messages: list[str] = field(default_factory=list)  # "GPU 3: <warning>" for each failing/warning result


@dataclass
class DiagResult:
    layout: str | None = None  # "dcgm3" | "dcgm4"; None: not a dcgmi diag report
    tests: list[DiagTest] = field(default_factory=list)
    runtime_error: str | None = None
    error: str | None = None  # why the text could not be read

    @property
    def failed(self) -> list[DiagTest]:
        return [t for t in self.tests if t.status in ("fail", "unknown")]

    @property
    def warned(self) -> list[DiagTest]:
        return [t for t in self.tests if t.status == "warn"]


def _text(v: Any, limit: int = MESSAGE_MAX) -> str:
    return v[:limit] if isinstance(v, str) else ""


def _status(v: Any) -> str:
    return _STATUS.get(v.strip().lower(), "unknown") if isinstance(v, str) else "unknown"


def _messages(result: dict[str, Any], entity: str, out: list[str]) -> None:
    warnings = result.get("warnings")
    for w in warnings[:MAX_MESSAGES] if isinstance(warnings, list) else []:
        msg = _text(w.get("warning") or w.get("warnings")) if isinstance(w, dict) else _text(w)
        if msg and len(out) < MAX_MESSAGES:
            out.append(f"{entity}: {msg}" if entity else msg)


def _entity(result: dict[str, Any]) -> str:
    if isinstance(result.get("entity_id"), int):
        return f"{_text(result.get('entity_group'), 16) or 'GPU'} {result['entity_id']}"
    gpu = result.get("gpu_id")
    return f"GPU {_text(gpu, 64)}" if isinstance(gpu, str) and gpu else ""


def parse(text: str) -> DiagResult:
    """One ``dcgmi diag -j`` stdout; never raises (an unreadable text is ``error``)."""
    res = DiagResult()
    if len(text) > MAX_BYTES:
        res.error = f"output over {MAX_BYTES} bytes"
        return res
    start = text.find("{")
    try:
        doc = json.loads(text[start:]) if start >= 0 else None
    except (ValueError, RecursionError) as exc:
        res.error = f"not JSON: {str(exc)[:200]}"
        return res
    if not isinstance(doc, dict):
        res.error = "no JSON object in the output"
        return res
    body: Any = None
    for root, layout in ROOTS.items():
        if isinstance(doc.get(root), dict):
            res.layout, body = layout, doc[root]
            break
    if body is None:
        res.error = f"neither {' nor '.join(repr(r) for r in ROOTS)} in the JSON"
        return res
    if isinstance(body.get("runtime_error"), str):
        res.runtime_error = _text(body["runtime_error"])
    categories = body.get("test_categories")
    for cat in categories if isinstance(categories, list) else []:
        if not isinstance(cat, dict) or not isinstance(cat.get("tests"), list):
            continue
        for test in cat["tests"]:
            if len(res.tests) >= MAX_TESTS:
                return res
            if not isinstance(test, dict):
                continue
            results = test.get("results")
            results = [r for r in results[:MAX_RESULTS] if isinstance(r, dict)] if isinstance(results, list) else []
            summary = test.get("test_summary")
            worst = max((_status(r.get("status")) for r in results), key=_RANK.__getitem__, default="not_run")
            status = _status(summary.get("status")) if isinstance(summary, dict) and "status" in summary else worst
            messages: list[str] = []
            for r in results:
                if _status(r.get("status")) in ("fail", "warn", "unknown"):
                    _messages(r, _entity(r), messages)
            if isinstance(summary, dict) and status in ("fail", "warn"):
                _messages(summary, "", messages)
            res.tests.append(DiagTest(category=_text(cat.get("category"), 64), name=_text(test.get("name"), 128),
                                      status=status, messages=messages))
    return res
