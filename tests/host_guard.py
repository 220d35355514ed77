"""The test suite leaves the host alone (issue 22): nothing left in the temporary directory, and
nothing in the machine's real kernel log that any reader could take for a GPU event.

A pytest plugin (tests/conftest.py loads it). At the start of the session it notes what the
temporary directory holds and the kernel log's next sequence number; at the end it fails the session
(exit status 1, with what it found) when

* an entry of the temporary directory that was not there before is still there, except pytest's
  own ``pytest-of-<user>`` when it holds no file (``tmp_path_retention_policy = "failed"`` in
  pyproject.toml empties it after a passing run: only a failed test's files are kept, to debug it);
* a record written to /dev/kmsg during the session is read as a finding by the agent's own kernel
  log parser (an Xid, SXid, fallen-off-the-bus, module error), or any record of the suite's
  self-test is there although the real-kmsg test was not asked for (``GNA_TEST_REAL_KMSG=1``,
  which .ci/run sets).

``GNA_TEST_HOST_GUARD=0`` turns it off, for a developer whose other work writes to the same
temporary directory while the suite runs.

Where /dev/shm is a writable tmpfs, the tests' ``tmp_path`` directories live there (``--basetemp``
/dev/shm/gna-pytest-<uid>-<pid>, removed after a passing run; a failed run keeps it for debugging until
the next run, which removes those whose process has ended): the suite creates tens of thousands of small files (host-root trees, per-rank
logs, JetStream stores), and on CI's disk each creation costs ~0.7 ms (a 4-node scenario: 3.3 s on
disk, 0.2 s on tmpfs). ``GNA_TEST_TMPFS=0``, or an explicit ``--basetemp``, keeps pytest's default.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from collectors.formats.kmsg_records import NvidiaLineParser, parse_record

SELFTEST = "gna-selftest-"  # what tests/test_kmsg.py's real-kmsg record starts with
REAL_KMSG = "GNA_TEST_REAL_KMSG"

_state: dict[str, object] = {}


def _enabled() -> bool:
    return os.environ.get("GNA_TEST_HOST_GUARD", "1") != "0"


def real_kmsg_allowed() -> bool:
    """The real-/dev/kmsg test runs only when asked for (.ci/run asks)."""
    return os.environ.get(REAL_KMSG) == "1"


def _kmsg_records(start_seq: int | None) -> list[tuple[int, str]] | None:
    """(seq, text) of every record from ``start_seq`` on (None: the next one), or None if unreadable."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    out: list[tuple[int, str]] = []
    try:
        if start_seq is None:
            os.lseek(fd, 0, os.SEEK_END)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                raw = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: records overwritten before they were read; go on from the next
                continue
            rec = parse_record(raw)
            if rec is not None and (start_seq is None or rec.seq >= start_seq):
                out.append((rec.seq, rec.message))
    finally:
        os.close(fd)
    return out


def _next_kmsg_seq() -> int | None:
    recs = _kmsg_records(0)
    if recs is None:
        return None
    return (recs[-1][0] + 1) if recs else 0


def _holds_a_file(path: Path) -> bool:
    if not path.is_dir() or path.is_symlink():
        return True
    return any(not p.is_dir() or p.is_symlink() for p in path.rglob("*"))


SHM = Path("/dev/shm")


def _tmpfs_basetemp() -> Path | None:
    if os.environ.get("GNA_TEST_TMPFS", "1") == "0" or not SHM.is_dir() or not os.access(SHM, os.W_OK):
        return None
    try:
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            if not any(f[1] == str(SHM) and f[2] == "tmpfs" for f in (line.split() for line in fh) if len(f) > 2):
                return None
    except OSError:
        return None
    prefix = f"gna-pytest-{os.getuid()}-"
    for old in SHM.glob(prefix + "*"):  # a finished run's directory, kept because it failed
        pid = old.name.removeprefix(prefix)
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)
    # one directory per pytest process: a session started by a test (pytester, a subprocess) has
    # its own and cannot remove the outer session's directories
    return SHM / f"{prefix}{os.getpid()}"


@pytest.hookimpl(tryfirst=True)  # before pytest's tmpdir plugin reads the option
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None and (base := _tmpfs_basetemp()) is not None:
        config.option.basetemp = str(base)
        _state["tmpfs_basetemp"] = base


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _enabled() or hasattr(session.config, "workerinput"):
        return  # under pytest-xdist the controller's session spans every worker's: it alone checks
    tmp = Path(tempfile.gettempdir())
    _state["tmp"] = tmp
    _state["before"] = set(os.listdir(tmp))
    _state["kmsg_seq"] = _next_kmsg_seq()


def leftovers() -> tuple[list[str], list[str]]:
    """(new entries of the temporary directory, kernel log records that mislead) since the session began."""
    tmp = _state.get("tmp")
    left: list[str] = []
    if isinstance(tmp, Path):
        before = _state.get("before")
        assert isinstance(before, set)
        for name in sorted(set(os.listdir(tmp)) - before):
            path = tmp / name
            if name.startswith("pytest-of-") and not _holds_a_file(path):
                continue
            left.append(str(path))
    misleading: list[str] = []
    seq = _state.get("kmsg_seq")
    if isinstance(seq, int):
        parser = NvidiaLineParser()
        for _s, text in _kmsg_records(seq) or []:
            if parser.feed(text) is not None or (SELFTEST in text and not real_kmsg_allowed()):
                misleading.append(text[:200])
    return left, misleading


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    base = _state.get("tmpfs_basetemp")
    if isinstance(base, Path) and exitstatus == 0:
        shutil.rmtree(base, ignore_errors=True)
    if not _enabled() or "tmp" not in _state or exitstatus != 0:
        return  # a failed run keeps its failed tests' directories on purpose
    left, misleading = leftovers()
    if not left and not misleading:
        return
    lines = ["", "the test suite did not leave the host alone (tests/host_guard.py):"]
    lines += [f"  left in the temporary directory: {p}" for p in left[:20]]
    lines += [f"  written to the kernel log: {t}" for t in misleading[:20]]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for line in lines:
            reporter.write_line(line, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
