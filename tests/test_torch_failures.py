"""collectors/formats/torch_failures.py on real captures (tests/fixtures/torch_failures/, see its README.md) and on
text composed from the format strings at their sources; property tests for what arbitrary input can do to it."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.formats.torch_failures import (
    MAX_BLOCK_LINES,
    MAX_CGROUP,
    MAX_COMM,
    MAX_ERROR_FILE,
    MAX_EXCEPTION,
    MAX_HOST,
    MAX_NCCL_FOLLOW,
    MAX_NCCL_TEXT,
    MAX_PEER,
    MAX_SCRIPT,
    MAX_SIGNAL,
    MAX_TIME,
    NCCL_KINDS,
    FailureReportReader,
    NcclError,
    NcclErrorReader,
    OomKill,
    RankFailure,
    iter_rank_failures,
    parse_nccl_error,
    parse_oom_kill,
    signal_name,
)

FIXTURES = Path(__file__).parent / "fixtures" / "torch_failures"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text(encoding="utf-8").splitlines()


def _row(f: RankFailure) -> tuple[object, ...]:
    return (f.index, f.rank, f.local_rank, f.exitcode, f.pid, f.signal, f.root_cause, f.time, f.error_file,
            f.exception)


GLOO_RESET = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[127.0.0.1]:{port}: Connection reset by peer. This is typically caused by a remote worker hanging or "
              "bugs in the application. Check the logs of the remote worker before reporting an error. GLHF! 🏖️")
NCCL_LINE = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
             "remote process exited or there was a network error, NCCL version 2.21.5")
INJECTED = "RuntimeError: step 1 failed on rank 1: injected fault for the failure-report fixture"
TMP = "/dev/shm/train/tmp"

# (index, rank, local_rank, exitcode, pid, signal, root cause, time, error_file, exception), in the report's order
EXPECTED: dict[str, list[tuple[object, ...]]] = {
    "torchrun_sigkill_rank2.log": [
        (1, 0, 0, -15, 29008, "SIGTERM", False, "2026-12-06_04:24:46", "", ""),
        (2, 1, 1, -15, 29009, "SIGTERM", False, "2026-12-06_04:24:46", "", ""),
        (3, 3, 3, -15, 29011, "SIGTERM", False, "2026-12-06_04:24:46", "", ""),
        (0, 2, 2, -9, 29010, "SIGKILL", True, "2026-12-06_04:24:46", "", ""),
    ],
    "torchrun_raise_rank1.log": [
        (1, 0, 0, -15, 29042, "SIGTERM", False, "2026-12-06_04:24:51", "", ""),
        (2, 2, 2, -15, 29044, "SIGTERM", False, "2026-12-06_04:24:51", "", ""),
        (3, 3, 3, -15, 29045, "SIGTERM", False, "2026-12-06_04:24:51", "", ""),
        (0, 1, 1, 1, 29043, "", True, "2026-12-06_04:24:50",
         f"{TMP}/torchelastic_ozqx9ufl/torchrun_raise_rank1_o35lp826/attempt_0/1/error.json", INJECTED),
    ],
    "torchrun_sigkill_in_collective.log": [
        (1, 0, 0, -15, 29084, "SIGTERM", False, "2026-12-06_04:24:55",
         f"{TMP}/torchelastic_1rf54r7x/torchrun_sigkill_in_collective_53owwnhs/attempt_0/0/error.json",
         GLOO_RESET.format(port=46313)),
        (2, 1, 1, -15, 29085, "SIGTERM", False, "2026-12-06_04:24:55", "", ""),
        (3, 2, 2, -15, 29086, "SIGTERM", False, "2026-12-06_04:24:55",
         f"{TMP}/torchelastic_1rf54r7x/torchrun_sigkill_in_collective_53owwnhs/attempt_0/2/error.json",
         GLOO_RESET.format(port=33411)),
        (0, 3, 3, -9, 29087, "SIGKILL", True, "2026-12-06_04:24:55", "", ""),
    ],
    "torchrun_nccl_text_sigkill_rank3.log": [
        (1, 0, 0, -15, 29109, "SIGTERM", False, "2026-12-06_04:24:59",
         f"{TMP}/torchelastic_xzbb7hzr/torchrun_nccl_text_sigkill_rank3_2egy1zrb/attempt_0/0/error.json", NCCL_LINE),
        (2, 1, 1, -15, 29110, "SIGTERM", False, "2026-12-06_04:24:59", "", ""),
        (3, 2, 2, -15, 29111, "SIGTERM", False, "2026-12-06_04:24:59",
         f"{TMP}/torchelastic_xzbb7hzr/torchrun_nccl_text_sigkill_rank3_2egy1zrb/attempt_0/2/error.json", NCCL_LINE),
        (0, 3, 3, -9, 29112, "SIGKILL", True, "2026-12-06_04:24:59", "", ""),
    ],
    "torchrun_tee_sigkill_rank2.log": [
        (1, 0, 0, -15, 29134, "SIGTERM", False, "2026-12-06_04:25:03", "", ""),
        (2, 1, 1, -15, 29135, "SIGTERM", False, "2026-12-06_04:25:03", "", ""),
        (3, 3, 3, -15, 29137, "SIGTERM", False, "2026-12-06_04:25:03", "", ""),
        (0, 2, 2, -9, 29136, "SIGKILL", True, "2026-12-06_04:25:03", "", ""),
    ],
    "torchrun_prefix_filter_raise_rank1.log": [
        (1, 0, 0, -15, 29167, "SIGTERM", False, "2026-12-06_04:25:08", "", ""),
        (2, 2, 2, -15, 29169, "SIGTERM", False, "2026-12-06_04:25:08", "", ""),
        (3, 3, 3, -15, 29170, "SIGTERM", False, "2026-12-06_04:25:08", "", ""),
        (0, 1, 1, 1, 29168, "", True, "2026-12-06_04:25:07",
         "/dev/shm/train/logs/torchrun_prefix_filter_raise_rank1_ugorp50l/attempt_0/1/error.json", INJECTED),
    ],
    # torch 2.5.0's format: no signal name on the exitcode line, the parser names it from the exit code
    "torch250_report_sigkill.log": [
        (1, 0, 0, -15, 29502, "SIGTERM", False, "2026-12-06_04:25:39", "", ""),
        (2, 1, 1, -15, 29503, "SIGTERM", False, "2026-12-06_04:25:39", "", ""),
        (3, 3, 3, -15, 29505, "SIGTERM", False, "2026-12-06_04:25:39", "", ""),
        (0, 2, 2, -9, 29504, "SIGKILL", True, "2026-12-06_04:25:39", "", ""),
    ],
    "torch250_report_raise.log": [
        (1, 0, 0, -15, 29507, "SIGTERM", False, "2026-12-06_04:25:40", "", ""),
        (2, 2, 2, -15, 29509, "SIGTERM", False, "2026-12-06_04:25:40", "", ""),
        (3, 3, 3, -15, 29510, "SIGTERM", False, "2026-12-06_04:25:40", "", ""),
        (0, 1, 1, 1, 29508, "", True, "2026-12-06_04:25:40", f"{TMP}/attempt_0/1/error.json", INJECTED),
    ],
}


def test_every_fixture_has_expectations() -> None:
    assert {p.name for p in FIXTURES.glob("t*.log")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_reports(name: str) -> None:
    reader = FailureReportReader()
    got = [f for line in _lines(name) for f in reader.feed(line)]
    reader.finish()
    assert [_row(f) for f in got] == EXPECTED[name]
    assert {(f.script, f.host) for f in got} == {("train.py", "gpu-node-07")}
    assert (reader.reports, reader.malformed, reader.abandoned) == (1, 0, 0)
    assert (reader.open_lines, reader.open_entries) == (0, 0)


# Prefixes a log pipeline puts before each line: a CRI record (the kubelet's container log; RFC 3339 with
# nanoseconds, trailing zeros trimmed, so its length varies), `kubectl logs --timestamps`, `srun --label`, pdsh,
# journald's short format.
def _cri(i: int, line: str) -> str:
    nanos = str(123456789 - i * 1000).rstrip("0")
    return f"2026-12-06T04:24:{46 + i % 10:02d}.{nanos}Z stderr F {line}"


PREFIXERS: dict[str, Callable[[int, str], str]] = {
    "cri": _cri,
    "kubectl": lambda i, line: f"2026-12-06T04:24:46.{100000 + i}Z {line}",
    "srun": lambda i, line: f"0: {line}",
    "pdsh": lambda i, line: f"gpu-node-07: {line}",
    "journald": lambda i, line: f"Dec 06 04:24:{i % 60:02d} gpu-node-07 torchrun[{2900 + i}]: {line}",
}


@pytest.mark.parametrize("prefixer", sorted(PREFIXERS))
@pytest.mark.parametrize("name", ["torchrun_raise_rank1.log", "torchrun_nccl_text_sigkill_rank3.log",
                                  "torch250_report_sigkill.log"])
def test_fixture_reports_behind_prefixes(name: str, prefixer: str) -> None:
    wrap = PREFIXERS[prefixer]
    got = list(iter_rank_failures(wrap(i, line) for i, line in enumerate(_lines(name))))
    assert [_row(f) for f in got] == EXPECTED[name]
    assert {f.script for f in got} == {"train.py"}


def test_a_prefix_too_long_to_learn_still_gives_the_ranks() -> None:
    long = "x" * 300 + " "
    got = list(iter_rank_failures(long + line for line in _lines("torchrun_raise_rank1.log")))
    assert [_row(f)[:8] for f in got] == [row[:8] for row in EXPECTED["torchrun_raise_rank1.log"]]
    assert got[-1].script == "train.py" and got[-1].exception == ""  # tracebacks are read behind learned prefixes only


def test_report_with_only_a_root_cause_and_no_error_file() -> None:
    # _MSG_FORMAT_TEMPLATE with "  <NO_OTHER_FAILURES>"; a non-signal exit without an error file (no @record)
    lines = [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 60,
        "/opt/train/pretrain.py FAILED",
        "-" * 60,
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "-" * 60,
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-12-06_05:00:01",
        "  host      : gpu-node-07.cluster.local",
        "  rank      : 13 (local_rank: 5)",
        "  exitcode  : 1 (pid: 4242) ",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "=" * 60,
    ]
    (f,) = iter_rank_failures(lines)
    assert (f.script, f.root_cause, f.rank, f.local_rank, f.host, f.exitcode, f.pid, f.signal, f.error_file,
            f.exception) == ("/opt/train/pretrain.py", True, 13, 5, "gpu-node-07.cluster.local", 1, 4242, "", "",
                             "")


def test_chained_exception_names_the_last() -> None:
    head = ["=" * 60, "train.py FAILED", "-" * 60, "Failures:", "  <NO_OTHER_FAILURES>", "-" * 60,
            "Root Cause (first observed failure):", "[0]:", "  time      : 2026-12-06_05:00:01",
            "  host      : gpu-node-07", "  rank      : 3 (local_rank: 3)", "  exitcode  : 1 (pid: 77) ",
            "  error_file: /tmp/e.json"]
    traceback = [
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in step',
        "    except RuntimeError:",
        "ValueError: first",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "train.py", line 9, in main',
        '    raise OSError("second") from e',
        "OSError: second",
        "with a second line",
        "=" * 60,  # a banner in the message: indented like the rest, it ends nothing
        "",
    ]
    text = "\n".join(head) + "\n  traceback : " + "\n  ".join(traceback) + "\n" + "=" * 60
    (f,) = iter_rank_failures(text.splitlines())
    assert (f.rank, f.exception, f.error_file) == (3, "OSError: second", "/tmp/e.json")


def test_signal_names() -> None:
    assert [signal_name(n) for n in (9, 15, 11, 6, 7, 99)] == ["SIGKILL", "SIGTERM", "SIGSEGV", "SIGABRT", "SIGBUS",
                                                               ""]


MALFORMED = [
    ("rank      : 1 (local_rank: 1)", "rank      : one (local_rank: 1)"),
    ("rank      : 1 (local_rank: 1)", "rank      : 1234567890123 (local_rank: 1)"),
    ("exitcode  : 1 (pid: 29043) ", "exitcode  : 1 (pid: -3)"),
    ("time      : 2026-12-06_04:24:50", "time      : yesterday"),
    ("host      : gpu-node-07\n  rank      : 1", "host      : " + "h" * (MAX_HOST + 1) + "\n  rank      : 1"),
    ("Root Cause (first observed failure):", "Root cause:"),
]


@pytest.mark.parametrize(("old", "new"), MALFORMED)
def test_malformed_report_is_dropped_and_counted(old: str, new: str) -> None:
    text = (FIXTURES / "torchrun_raise_rank1.log").read_text(encoding="utf-8")
    start = text.index("Root Cause")  # the root cause's entry, rank 1
    assert old in text[start:]
    broken = text[:start] + text[start:].replace(old, new, 1)
    reader = FailureReportReader()
    assert [f for line in broken.splitlines() for f in reader.feed(line)] == []
    reader.finish()
    assert (reader.reports, reader.malformed + reader.abandoned) == (0, 1)


def test_an_unfinished_report_is_dropped_within_its_bound() -> None:
    reader = FailureReportReader(max_block_lines=50)
    lines = _lines("torchrun_sigkill_rank2.log")
    cut = 1 + next(i for i, line in enumerate(lines) if line.startswith("  traceback : "))  # inside [1]:
    for line in lines[:cut]:
        reader.feed(line)
    for i in range(200):
        reader.feed(f"  traceback line {i}")
        assert reader.open_lines <= 50
    assert reader.abandoned == 1 and reader.open_lines == 0
    # and the reader still reads the next report
    assert [_row(f) for line in lines for f in reader.feed(line)] == EXPECTED["torchrun_sigkill_rank2.log"]


def test_too_many_entries_is_malformed() -> None:
    head = ["=" * 60, "train.py FAILED", "-" * 60, "Failures:"]
    entry = ["[{i}]:", "  time      : 2026-12-06_04:24:46", "  host      : h", "  rank      : {i} (local_rank: 0)",
             "  exitcode  : -15 (pid: {i})", "  error_file: <N/A>", "  traceback : Signal 15 (SIGTERM) received by PID 1"]
    reader = FailureReportReader(max_entries=8)
    for line in head + [x.format(i=i) for i in range(1, 20) for x in entry]:
        assert reader.feed(line) == ()
        assert reader.open_entries <= 8
    assert reader.malformed == 1


# -- NCCL -------------------------------------------------------------------------------------------------------

def test_nccl_errors_in_the_fixture() -> None:
    reader = NcclErrorReader()
    got = [e for line in _lines("torchrun_nccl_text_sigkill_rank3.log") for e in reader.feed(line)]
    assert reader.finish() is None
    def expect(rank: int | None) -> NcclError:
        return NcclError(
            exception="torch.distributed.DistBackendError", where="../torch/csrc/distributed/c10d/NCCLUtils.hpp:317",
            kind="ncclRemoteError", remote_exited=True, nccl_version="2.21.5",
            detail="ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
                   "prematurely.",
            last_error="socketProgress: Connection closed by remote peer gpu-node-08<48212>",
            peer="gpu-node-08<48212>", peer_event="closed", rank=rank)

    # two through PyTorch's excepthook ([rank2]:, [rank0]:), two inside the report's tracebacks (no rank there)
    assert got == [expect(2), expect(0), expect(None), expect(None)]
    # the report's entries read theirs with their rank
    failures = list(iter_rank_failures(_lines("torchrun_nccl_text_sigkill_rank3.log")))
    assert [f.nccl for f in failures] == [expect(0), None, expect(2), None]
    assert all(f.nccl is None for name in EXPECTED if name != "torchrun_nccl_text_sigkill_rank3.log"
               for f in iter_rank_failures(_lines(name)))


def _nccl_text(where: str, result: str, version: str, detail: str, last: str | None) -> str:
    # C10D_NCCL_CHECK: "NCCL error in: " + __FILE__ + ":" + __LINE__ + ", " + ncclGetErrorWithVersion(result) +
    # "\n" + getNcclErrorDetailStr(result): interpret + ("\nLast error:\n" + ncclGetLastError())
    text = f"NCCL error in: {where}, {result}, NCCL version {version}\n{detail}"
    return text + (f"\nLast error:\n{last}" if last is not None else "")


# ncclGetErrorString (NVIDIA/nccl src/init.cc v2.30.7-1) and getNcclErrorDetailStr's readings (pytorch v2.13.0)
KINDS = [
    ("unhandled cuda error (run with NCCL_DEBUG=INFO for details)", "ncclUnhandledCudaError",
     "ncclUnhandledCudaError: Call to CUDA function failed."),
    ("unhandled system error (run with NCCL_DEBUG=INFO for details)", "ncclSystemError",
     "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. "),
    ("internal error - please report this issue to the NCCL developers", "ncclInternalError",
     "ncclInternalError: Internal check failed."),
    ("invalid argument (run with NCCL_DEBUG=WARN for details)", "ncclInvalidArgument",
     "ncclInvalidArgument: Invalid value for an argument."),
    ("invalid usage (run with NCCL_DEBUG=WARN for details)", "ncclInvalidUsage",
     "ncclInvalidUsage: This usually reflects invalid usage of NCCL library."),
    ("remote process exited or there was a network error", "ncclRemoteError",
     "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."),
    ("timeout", "ncclTimeout", "Unknown NCCL error!"),
    ("unknown result code", "", "Unknown NCCL error!"),
]


@pytest.mark.parametrize(("result", "kind", "detail"), KINDS)
def test_nccl_kinds(result: str, kind: str, detail: str) -> None:
    text = _nccl_text("/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3763", result, "2.28.9+cuda12.9",
                      detail, "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000")
    lines = [f"[rank1]: {x}" for x in f"torch.distributed.DistBackendError: {text}".split("\n")]
    err = parse_nccl_error(lines)
    assert err is not None
    assert (err.kind, err.remote_exited, err.nccl_version, err.where, err.rank, err.peer) == (
        kind, kind == "ncclRemoteError", "2.28.9+cuda12.9",
        "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3763", 1, "")
    assert err.detail == detail.strip()
    assert err.last_error == "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000"


def test_nccl_watchdog_form_and_older_texts() -> None:
    # ProcessGroupNCCL::checkForNCCLErrorsInternal: "NCCL error: " + ncclGetErrorWithVersion + "\n" + detail, here
    # in the watchdog's log line (c10 logging header and the PG's log prefix before it)
    err = parse_nccl_error([
        "[rank5]:[E1206 04:30:00.123456789 ProcessGroupNCCL.cpp:1710] [PG ID 0 PG GUID 0(default_pg) Rank 5] Process "
        "group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network "
        "error, NCCL version 2.21.5",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        "Last error:",
        "NET/IB : Got completion from peer 10.42.3.17<41122> with status=12 opcode=0 len=0 vendor err 129 (Recv)",
    ])
    assert err is not None and (err.exception, err.where, err.kind, err.rank, err.peer, err.peer_event) == (
        "", "", "ncclRemoteError", 5, "10.42.3.17<41122>", "ib_completion")
    # NCCL 2.14's socket WARN ("Net : ..."), ncclInternalError around a peer's exit (as NVIDIA/nccl#1514 quotes it)
    err = parse_nccl_error([
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, "
        "internal error, NCCL version 2.14.3",
        "ncclInternalError: Internal check failed.", "Last error:", "Net : Connection closed by remote peer user<50260>",
    ])
    assert err is not None and (err.kind, err.remote_exited, err.peer, err.peer_event) == (
        "ncclInternalError", False, "user<50260>", "closed")
    # NCCL 2.7's strings had no parentheses; PyTorch 1.x raised RuntimeError without the detail lines
    err = parse_nccl_error(["RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:784, "
                            "unhandled system error, NCCL version 2.7.8"])
    assert err is not None and (err.exception, err.kind, err.nccl_version, err.detail) == (
        "RuntimeError", "ncclSystemError", "2.7.8", "")
    # recv failures name the peer numerically; an empty last error reads on one line; an unknown version
    err = parse_nccl_error(["NCCL error in: a.cpp:1, remote process exited or there was a network error, NCCL "
                            "version Unknown NCCL version", "ncclRemoteError: x", "Last error:",
                            "socketProgressOpt: Call to recv from 172.16.0.4<33759> failed : Connection reset by peer"])
    assert err is not None and (err.nccl_version, err.peer, err.peer_event) == ("", "172.16.0.4<33759>", "recv_failed")
    err = parse_nccl_error(["NCCL error in: a.cpp:1, internal error, NCCL version 2.21.5",
                            "ncclInternalError: Internal check failed.", "Last error: Unknown NCCL Error"])
    assert err is not None and (err.last_error, err.peer) == ("Unknown NCCL Error", "")
    assert parse_nccl_error(["NCCL WARN socketProgress: Connection closed by remote peer a<1>"]) is None
    assert parse_nccl_error([]) is None


def test_nccl_reader_ends_an_error_at_an_unrelated_line() -> None:
    reader = NcclErrorReader()
    assert reader.feed("[rank3]: torch.distributed.DistBackendError: NCCL error in: x.cpp:9, invalid usage "
                       "(run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5") == ()
    (err,) = reader.feed("[rank1]: Traceback (most recent call last):")
    assert (err.kind, err.rank, err.detail, err.last_error) == ("ncclInvalidUsage", 3, "", "")
    assert reader.finish() is None


# -- the kernel's OOM killer ------------------------------------------------------------------------------------

def test_oom_fixture() -> None:
    got = [o for line in _lines("kernel_oom_memcg_dmesg.log") if (o := parse_oom_kill(line)) is not None]
    assert got == [
        OomKill(form="summary", pid=29187, comm="python", uid=0, memcg=True, constraint="CONSTRAINT_MEMCG",
                task_memcg="/gna_oom_fixture", anon_rss_kb=None),
        OomKill(form="killed", pid=29187, comm="python", uid=0, memcg=True, constraint="", task_memcg="",
                anon_rss_kb=260848),
    ]


def test_oom_other_forms() -> None:
    # the machine out of memory, journald's rendering, a kubepods cgroup, a comm with a space and parentheses
    o = parse_oom_kill("Dec 06 04:30:00 gpu-node-07 kernel: oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),"
                       "cpuset=cri-containerd-5f1c.scope,mems_allowed=0-1,global_oom,task_memcg=/kubepods.slice/"
                       "kubepods-burstable.slice/kubepods-burstable-pod1f2e.slice/cri-containerd-5f1c.scope,"
                       "task=pt_main_thread,pid=81234,uid=1000")
    assert o == OomKill(form="summary", pid=81234, comm="pt_main_thread", uid=1000, memcg=False,
                        constraint="CONSTRAINT_NONE",
                        task_memcg="/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e.slice/"
                                   "cri-containerd-5f1c.scope", anon_rss_kb=None)
    o = parse_oom_kill("[ 8123.456789] Out of memory: Killed process 81234 (data (loader)) total-vm:1234kB, "
                       "anon-rss:99kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:12kB oom_score_adj:0")
    assert o is not None and (o.pid, o.comm, o.uid, o.memcg, o.anon_rss_kb) == (81234, "data (loader)", 1000, False, 99)
    # Linux 4.x: no message, no UID
    o = parse_oom_kill("<3>[12.5] Killed process 77 (python3) total-vm:10kB, anon-rss:5kB, file-rss:0kB, "
                       "shmem-rss:0kB")
    assert o is not None and (o.pid, o.comm, o.uid, o.anon_rss_kb) == (77, "python3", None, 5)
    assert parse_oom_kill("[12.5] oom_reaper: reaped process 77 (python3), now anon-rss:0kB") is None
    assert parse_oom_kill("Killed process abc") is None


# -- properties -------------------------------------------------------------------------------------------------

def _check_failure(f: RankFailure) -> None:
    assert 0 < len(f.script) <= MAX_SCRIPT and len(f.host) <= MAX_HOST and len(f.time) <= MAX_TIME
    assert len(f.error_file) <= MAX_ERROR_FILE and len(f.exception) <= MAX_EXCEPTION and len(f.signal) <= MAX_SIGNAL
    assert abs(f.rank) < 10**9 and abs(f.local_rank) < 10**9 and abs(f.exitcode) < 10**10 and 0 <= f.pid < 10**10
    if f.nccl is not None:
        _check_nccl(f.nccl)
        assert f.nccl.rank == f.rank


def _check_nccl(e: NcclError) -> None:
    assert e.kind in NCCL_KINDS or e.kind == ""
    for text in (e.exception, e.where, e.detail, e.last_error):
        assert len(text) <= MAX_NCCL_TEXT
    assert len(e.peer) <= MAX_PEER and (e.rank is None or abs(e.rank) < 10**9)


def _check_oom(o: OomKill) -> None:
    assert len(o.comm) <= MAX_COMM and len(o.task_memcg) <= MAX_CGROUP and 0 <= o.pid < 10**10


def _feed_all(lines: list[str], reader: FailureReportReader) -> list[RankFailure]:
    out: list[RankFailure] = []
    nccl = NcclErrorReader()
    for line in lines:
        got = reader.feed(line)
        out.extend(got)
        assert reader.open_lines <= reader.max_block_lines and reader.open_entries <= reader.max_entries
        for e in nccl.feed(line):
            _check_nccl(e)
        o = parse_oom_kill(line)
        if o is not None:
            _check_oom(o)
    reader.finish()
    for f in out:
        _check_failure(f)
    return out


REPORT_ALPHABET = st.sampled_from([*"=-[]:()0123456789 -_ abcSIGKTERM\t",
                                   "  time      : ", "  host      : ", "  rank      : ", "  exitcode  : ",
                                   "  error_file: ", "  traceback : ", " FAILED", "Failures:", "=" * 20, "-" * 20,
                                   "Root Cause (first observed failure):", "(local_rank: ", "(pid: ", "NCCL error in: ",
                                   ", NCCL version ", "Last error:", "Killed process ", "oom-kill:constraint="])


@FAST
@given(st.lists(st.one_of(st.text(max_size=200), st.lists(REPORT_ALPHABET, max_size=30).map("".join)), max_size=80))
def test_arbitrary_lines_never_raise(lines: list[str]) -> None:
    _feed_all(lines, FailureReportReader(max_block_lines=40, max_entries=3))


@FAST
@given(st.binary(max_size=3000))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    _feed_all(data.decode("utf-8", "replace").splitlines(), FailureReportReader())


FIXTURE_LINES = [_lines(name) for name in sorted(EXPECTED)]


@FAST
@given(st.sampled_from(FIXTURE_LINES), st.integers(0, 2**32), st.integers(0, 4))
def test_mangled_reports_never_raise(lines: list[str], seed: int, how: int) -> None:
    rnd = random.Random(seed)
    lines = list(lines)
    if how == 0:  # cut short
        lines = lines[: rnd.randrange(len(lines) + 1)]
    elif how == 1:  # a stretch shuffled
        a = rnd.randrange(len(lines))
        b = min(len(lines), a + rnd.randrange(1, 20))
        part = lines[a:b]
        rnd.shuffle(part)
        lines[a:b] = part
    elif how == 2:  # lines lost
        lines = [line for line in lines if rnd.random() > 0.1]
    elif how == 3:  # lines repeated, truncated
        lines = [line[: rnd.randrange(len(line) + 1)] if rnd.random() < 0.2 else line for line in lines for _ in
                 range(1 + (rnd.random() < 0.1))]
    else:  # two captures interleaved line by line
        other = FIXTURE_LINES[seed % len(FIXTURE_LINES)]
        lines = [x for pair in zip(lines, other, strict=False) for x in pair]
    reader = FailureReportReader()
    got = _feed_all(lines, reader)
    assert len(got) <= sum(1 for line in lines if line.rstrip().endswith("]:"))


NCCL_EXC = NCCL_LINE
NCCL_FOLLOW = ["ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
               "Last error:", "socketProgress: Connection closed by remote peer gpu-node-08<48212>"]
NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_./-", min_size=1, max_size=40)


@st.composite
def reports(draw: st.DrawFn) -> tuple[list[str], list[tuple[object, ...]], str]:
    """A report rendered by the v2.5.0 or v2.13.0 templates from drawn failures, with a drawn line prefix."""
    new = draw(st.booleans())
    n = draw(st.integers(1, 6))
    ranks = draw(st.lists(st.integers(0, 100_000), min_size=n, max_size=n, unique=True))
    fails = []
    for i, rank in enumerate(ranks):
        code = draw(st.sampled_from([-9, -15, -11, -6, 1, 2, 137]))
        pid = draw(st.integers(1, 4_194_304))
        exc = draw(st.sampled_from(["", "RuntimeError: x", "torch.OutOfMemoryError: CUDA out of memory.", NCCL_EXC]))
        fails.append((i, rank, i % 8, code, pid, exc))
    script = draw(NAMES)
    host = draw(NAMES)
    prefix = draw(st.sampled_from(["", "0: ", "gpu-node-07: ", "2026-12-06T04:24:46.5Z stderr F "]))

    def entry(i: int, rank: int, lr: int, code: int, pid: int, exc: str) -> list[str]:
        sig = signal_name(-code) if code < 0 else ""
        tail = (f"  ({sig})" if sig else " ") if new else ""
        out = [f"[{i}]:", "  time      : 2026-12-06_04:24:46", f"  host      : {host}",
               f"  rank      : {rank} (local_rank: {lr})", f"  exitcode  : {code} (pid: {pid}){tail}"]
        if code < 0:
            out += ["  error_file: <N/A>", f"  traceback : Signal {-code} ({sig}) received by PID {pid}"]
        elif exc:
            out += [f"  error_file: /tmp/{i}/error.json", "  traceback : Traceback (most recent call last):",
                    '    File "train.py", line 1, in <module>', "      main()", f"  {exc}",
                    *([f"  {x}" for x in NCCL_FOLLOW] if exc == NCCL_EXC else []), "  "]
        else:
            out += ["  error_file: <N/A>",
                    "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"]
        return out

    others = [line for f in fails[1:] for line in entry(*f)] or ["  <NO_OTHER_FAILURES>"]
    body = ["=" * 60, f"{script} FAILED", "-" * 60, "Failures:", *others, "-" * 60,
            "Root Cause (first observed failure):", *entry(*fails[0]), "=" * 60]
    expected: list[tuple[object, ...]] = [(i, rank, lr, code, pid, signal_name(-code) if code < 0 else "", i == 0,
                 "" if code < 0 or not exc else f"/tmp/{i}/error.json", "" if code < 0 else exc,
                 "gpu-node-08<48212>" if code >= 0 and exc == NCCL_EXC else None)
                for i, rank, lr, code, pid, exc in fails[1:] + fails[:1]]
    return [prefix + line for line in body], expected, script


@FAST
@given(reports(), st.lists(st.text(max_size=60), max_size=5))
def test_rendered_reports_read_back(report: tuple[list[str], list[tuple[object, ...]], str], noise: list[str]) -> None:
    lines, expected, script = report
    got = list(iter_rank_failures([*noise, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                                   *lines]))
    assert [(f.index, f.rank, f.local_rank, f.exitcode, f.pid, f.signal, f.root_cause, f.error_file, f.exception,
             f.nccl.peer if f.nccl else None) for f in got] == expected
    assert all(f.nccl.rank == f.rank for f in got if f.nccl)
    assert {f.script for f in got} == {script}


@FAST
@given(st.lists(st.text(max_size=120), max_size=MAX_NCCL_FOLLOW + 3), st.sampled_from(["", "[rank7]: ", "  "]))
def test_nccl_parse_of_arbitrary_followers(follow: list[str], prefix: str) -> None:
    first = f"{prefix}torch.distributed.DistBackendError: NCCL error in: f.cpp:1, internal error, NCCL version 2.21.5"
    err = parse_nccl_error([first, *follow])
    assert err is not None and err.kind == "ncclInternalError"
    _check_nccl(err)
    reader = NcclErrorReader()
    got = [e for line in [first, *follow] for e in reader.feed(line)]
    last = reader.finish()
    for e in [*got, *([last] if last else [])]:
        _check_nccl(e)
    assert (got[0] if got else last) == err  # the stream reads it as the whole list does


def test_default_bounds() -> None:
    assert FailureReportReader().max_block_lines == MAX_BLOCK_LINES


def test_a_rank_s_own_cuda_error_and_gpu_oom() -> None:
    """c10/cuda C10_CUDA_CHECK ("CUDA error: <cudaGetErrorString>"), the caching allocator's OutOfMemoryError; as
    public logs show them behind PyTorch's excepthook prefix."""
    from collectors.formats.torch_failures import parse_cuda_error

    e = parse_cuda_error("[rank49]: RuntimeError: CUDA error: an illegal memory access was encountered")
    assert e is not None and (e.rank, e.exception, e.out_of_memory) == (49, "RuntimeError", False)
    assert e.text == "CUDA error: an illegal memory access was encountered"
    e = parse_cuda_error("torch.AcceleratorError: CUDA error: device-side assert triggered")
    assert e is not None and e.rank is None and e.exception == "torch.AcceleratorError"
    e = parse_cuda_error("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 "
                         "has a total capacity of 79.10 GiB of which 1.25 GiB is free.")
    assert e is not None and e.out_of_memory and e.rank == 3
    assert parse_cuda_error("CUDA kernel errors might be asynchronously reported at some other API call") is None
