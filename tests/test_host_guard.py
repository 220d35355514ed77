"""tests/host_guard.py fails a session that leaves something in the temporary directory (issue 22)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

LEAKS = '''
import tempfile
from pathlib import Path

def test_leaks():
    Path(tempfile.gettempdir(), "left-behind.txt").write_text("x")
'''

CLEAN = '''
import tempfile

def test_clean():
    with tempfile.TemporaryDirectory() as d:
        assert d

def test_uses_tmp_path(tmp_path):
    (tmp_path / "f").write_text("x")
'''


def _inner(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    tests = tmp_path / "inner"
    tests.mkdir()
    (tests / "test_inner.py").write_text(body)
    (tests / "pytest.ini").write_text("[pytest]\ntmp_path_retention_policy = failed\n")
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT), "GNA_TEST_HOST_GUARD": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.host_guard", "-p", "no:cacheprovider",
                           "-q", str(tests)], cwd=tests, env=env, capture_output=True, text=True, timeout=120)


def test_a_session_that_leaves_a_file_in_tmp_fails(tmp_path: Path) -> None:
    r = _inner(tmp_path, LEAKS)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 passed" in r.stdout and "left in the temporary directory" in r.stdout
    assert "left-behind.txt" in r.stdout


def test_a_clean_session_passes_and_pytests_own_directories_are_emptied(tmp_path: Path) -> None:
    r = _inner(tmp_path, CLEAN)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed" in r.stdout and "temporary directory" not in r.stdout
