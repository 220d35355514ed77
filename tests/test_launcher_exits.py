"""collectors/formats/launcher_exits.py: srun's and mpirun's word on a process that ended, and how the NCCL
collector grades it (collectors/nccl/crash_evidence.py exit_reason)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from collectors.formats.launcher_exits import parse_launcher_exit
from collectors.nccl.crash_evidence import exit_reason


def test_srun_s_task_exit_lines() -> None:
    # slurm src/srun/launch.c _task_finish: error("%s: %s %s: Out Of Memory", hosts, task_str, tasks) etc.
    oom = parse_launcher_exit("srun: error: gpu-b17: task 11: Out Of Memory")
    assert oom is not None and (oom.host, oom.tasks, oom.oom, oom.rank) == ("gpu-b17", "11", True, None)
    assert exit_reason(oom)[0] == "OOMKilled"
    seg = parse_launcher_exit("  3: srun: error: gpu-b17: task 3: Segmentation fault (core dumped)")
    assert seg is not None and seg.signal == "Segmentation fault" and exit_reason(seg)[0] == "KilledBySignal"
    code = parse_launcher_exit("srun: error: gpu-a01: tasks 0-7: Exited with exit code 1")
    assert code is not None and code.exitcode == 1 and code.tasks == "0-7" and exit_reason(code)[0] == "PeerFailure"
    killed = parse_launcher_exit("srun: error: gpu-a01: task 2: Killed")
    assert killed is not None and exit_reason(killed)[0] == "PeerFailure"  # srun ending the others, or a cancel
    several = parse_launcher_exit("srun: error: gpu-[a01,b17]: tasks 0-15: Exited with exit code 1")
    assert several is not None and several.host == ""  # a hostlist names no one node


def test_mpirun_s_noticed_line() -> None:
    # as public logs show it ("mpirun noticed that process rank 1 with PID 0 on node fv-az714-650 exited on
    # signal 6 (Aborted).")
    x = parse_launcher_exit("2026-12-05T03:21:00.2Z stderr F mpirun noticed that process rank 4 with PID 0 on node "
                            "llama-worker-0 exited on signal 9 (Killed).")
    assert x is not None and (x.tool, x.rank, x.pid, x.host, x.signal) == ("mpirun", 4, 0, "llama-worker-0", "Killed")
    assert exit_reason(x)[0] == "KilledBySignal"  # the first process mpirun saw end: where the job broke
    assert parse_launcher_exit("mpirun noticed that process rank x with PID 0 on node a exited") is None


@given(st.text(max_size=600))
def test_any_line_parses_or_is_none_and_stays_bounded(line: str) -> None:
    for text in (line, "srun: error: " + line, "mpirun noticed that process rank " + line):
        x = parse_launcher_exit(text)
        if x is not None:
            assert len(x.host) <= 253 and len(x.tasks) <= 64 and len(x.what) <= 64
            assert exit_reason(x)[0] in ("OOMKilled", "KilledBySignal", "PeerFailure")


def test_mpirun_s_first_non_zero_exit_names_a_rank() -> None:
    """Open MPI's "non-zero-status" help text, as public logs show it (a CRI record prefix before each line)."""
    from collectors.formats.launcher_exits import MpirunFirstExit

    block = ["mpirun detected that one or more processes exited with non-zero status, thus causing",
             "the job to be terminated. The first process to do so was:", "", "  Process name: [[10810,1],49]",
             "  Exit code:    1", "-" * 74]
    r = MpirunFirstExit()
    got = [x for line in block if (x := r.feed("2026-12-05T14:47:55.1Z stderr F " + line)) is not None]
    assert len(got) == 1 and (got[0].rank, got[0].exitcode, got[0].host) == (49, 1, "")
    assert exit_reason(got[0])[0] == "ExitedWithError"
    r = MpirunFirstExit()  # a block cut short (8 lines without its exit code) is dropped
    assert [r.feed(x) for x in [block[1], *(["noise"] * 9), "  Exit code:    1"]] == [None] * 11
