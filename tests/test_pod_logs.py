"""Issue 24 (1, 3): Kubernetes container logs as a first-class source of the nccl_logs collector.

Formats as the kubelet reads them back (kubernetes/kubernetes pkg/kubelet/kuberuntime/logs/logs.go, v1.31):
CRI records ``<RFC 3339 nano> <stdout|stderr> <P|F>[:tags] <content>`` (containerd and CRI-O write a line
longer than their buffer as P records ended by an F one), Docker's json-file
``{"log":"...","stream":"...","time":"..."}`` (a ``log`` without its newline is partial; moby escapes
``<``, ``>`` and ``&`` as ``\\u003c``...). Paths as kubelet's BuildPodLogsDirectory lays them out:
``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log``. The PyTorch and NCCL lines are real
ones (tests/golden/nccl, PyTorch's ProcessGroupNCCL.cpp format).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.nccl import container_logs
from collectors.nccl.container_logs import pod_of_path, sniff
from collectors.nccl.line import parse_line
from collectors.nccl.matching import Match, match_or_reject
from collectors.nccl.prefilter import PREFILTER, candidate_lines
from sim.host import SimHost

UID = "5f0c2f52-3a0e-4c1e-9a77-0c3f1b7d2e10"
POD_DIR = f"/var/log/pods/team-a_llama-70b-worker-3_{UID}/pytorch"
WATCHDOG = ("[rank3]:[E1203 10:30:00.100000 77 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=4712, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, "
            "Timeout(ms)=600000) ran for 600081 milliseconds before timing out.")
INIT = ("llama-70b-worker-3:42:57 [3] NCCL INFO comm 0x55d0c8a0 rank 3 nranks 16 cudaDev 3 nvmlDev 3 busId 5d000 "
        "commId 0x8b1f2e3d4c5b6a79 - Init COMPLETE")


def cri(stream: str, tag: str, content: str, t: str = "2026-12-03T10:30:00.100000000Z") -> bytes:
    return f"{t} {stream} {tag} {content}\n".encode()


def docker(stream: str, text: str, t: str = "2026-12-03T10:30:00.100000000Z") -> bytes:
    # moby's jsonlog escapes like Go's encoding/json with HTML escaping on
    body = json.dumps(text)[1:-1].replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return ('{"log":"' + body + '","stream":"' + stream + '","time":"' + t + '"}\n').encode()


def keep(b: bytes) -> bool:
    return PREFILTER.search(b) is not None


def logical(fmt: container_logs.Format, data: bytes, *, final: bool = False, base: int = 0) -> container_logs.Lines:
    return container_logs.lines(fmt, data, base, candidate_lines(data, base), final=final, full=False, keep=keep)


def test_the_path_names_the_pod_and_nothing_else_does() -> None:
    ref = pod_of_path(f"{POD_DIR}/0.log")
    assert ref is not None and (ref.namespace, ref.pod, ref.uid, ref.container) == (
        "team-a", "llama-70b-worker-3", UID, "pytorch")
    assert pod_of_path("/var/log/nccl/node-a.42.log") is None
    assert pod_of_path(f"/var/log/pods/Team_A_{UID}/c/0.log") is None  # not DNS-1123: not the kubelet's


def test_formats_are_told_apart_from_the_first_line() -> None:
    assert sniff(cri("stderr", "F", "x").rstrip()) == "cri"
    assert sniff(docker("stderr", "x\n").rstrip()) == "docker"
    assert sniff(INIT.encode()) == "plain"
    assert sniff(b"2026-12-03T10:30:00.100000000Z " + INIT.encode()) == "plain"  # kubectl logs --timestamps


def test_a_watchdog_line_cut_into_partial_records_is_joined_and_matched() -> None:
    head, tail = WATCHDOG[:70], WATCHDOG[70:]
    data = (cri("stdout", "F", "step 100 loss 1.23") + cri("stderr", "P", head)
            + cri("stdout", "F", "step 101 loss 1.22")  # the other stream's record is a line of its own
            + cri("stderr", "F", tail, "2026-12-03T10:30:00.200000000Z"))
    got = logical("cri", data, base=1000)
    assert got.joined == 1 and got.unfinished == 0
    ((offset, content, logged),) = got.lines
    assert content.decode() == WATCHDOG and offset == 1000 + len(cri("stdout", "F", "step 100 loss 1.23"))
    assert logged == "2026-12-03T10:30:00.100000000Z"  # the first record's time
    m = match_or_reject(parse_line(offset, content, logged))
    assert isinstance(m, Match) and m.rule.name == "watchdog" and m.fields["rank"] == 3
    assert m.line.logged == logged and not m.line.raw.startswith("2026")  # the runtime's header is off


def test_a_partial_run_not_ended_in_the_chunk_is_left_for_the_next_read() -> None:
    first = cri("stderr", "F", INIT)
    data = first + cri("stderr", "P", WATCHDOG[:50]) + cri("stdout", "F", "noise")
    got = logical("cri", data)
    assert got.unfinished == len(data) - len(first)  # from the run's first record on, the stdout line too
    assert [c.decode() for _o, c, _t in got.lines] == [INIT]
    done = logical("cri", data, final=True)  # `check` at the end of the file: joined as it is
    assert done.unfinished == 0 and done.joined == 1


def test_a_run_as_long_as_a_read_is_cut_not_waited_for_forever() -> None:
    data = b"".join(cri("stderr", "P", "x" * 100) for _ in range(20))
    got = container_logs.lines("cri", data, 0, [], final=False, full=True, keep=keep)
    assert got.unfinished == 0 and got.cut == 1
    capped = container_logs.lines("cri", data + cri("stderr", "F", "y"), 0, [], final=False, full=False, keep=keep,
                                  max_join=500)
    assert capped.cut >= 1 and capped.unfinished == 0


def test_docker_json_file_records_are_decoded_and_joined() -> None:
    sock = ("llama-70b-worker-3:42:57 [3] misc/socket.cc:50 NCCL WARN Net : Connection closed by remote peer "
            "<10.0.0.7>:43211")
    data = (docker("stderr", INIT + "\n") + docker("stderr", WATCHDOG[:60]) + docker("stderr", WATCHDOG[60:] + "\n")
            + docker("stderr", sock + "\n"))
    assert sniff(data.split(b"\n", 1)[0]) == "docker"
    got = logical("docker", data)
    assert [c.decode() for _o, c, _t in got.lines] == [INIT, WATCHDOG, sock]
    rules = [m.rule.name for _o, c, t in got.lines if isinstance(m := match_or_reject(parse_line(0, c, t)), Match)]
    assert rules == ["init", "watchdog", "socket_error"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["stdout", "stderr"]), st.sampled_from(["P", "F", "F:x", "X"]),
                          st.sampled_from([WATCHDOG[:40], WATCHDOG[40:], INIT, "NCCL WARN y", "", "junk \x00\xff"])),
                max_size=30), st.booleans(), st.binary(max_size=40))
def test_any_sequence_of_records_keeps_the_invariants(recs: list[tuple[str, str, str]], final: bool,
                                                      garbage: bytes) -> None:
    data = b"".join(cri(s, t, c) for s, t, c in recs) + (garbage.replace(b"\n", b"") + b"\n" if garbage else b"")
    got = logical("cri", data, final=final, base=7)
    assert 0 <= got.unfinished <= len(data)
    assert not final or got.unfinished == 0
    offsets = [o for o, _c, _t in got.lines]
    assert offsets == sorted(offsets) and all(7 <= o < 7 + len(data) - got.unfinished for o in offsets)
    for _o, content, logged in got.lines:
        assert keep(content)  # only lines that hold a needle
        assert not content.startswith(b"2026-12-03T") or not logged  # a parsed record's header is off


async def _collector(host: SimHost, **config: object) -> tuple[object, object]:
    from agent.emitter import CollectorEmitter, ConditionTracker
    from agent.facts import FactStore
    from collectors.nccl.plugin import NCCLLogsCollector, NCCLLogsConfig
    from gna_sdk.hostroot import HostRoot
    from tests.conftest import Sink

    sink = Sink()
    em = CollectorEmitter("gpu-0007", "nccl_logs", sink, ConditionTracker(None), facts=FactStore())
    c = NCCLLogsCollector(NCCLLogsConfig(**config), HostRoot(host.root), em)  # type: ignore[arg-type]
    c.live = True
    c.ras.enabled = False
    c.config.flight_recorder = False
    return c, sink


async def test_pod_logs_are_read_by_default_and_a_split_line_waits_for_its_end(tmp_path: Path) -> None:
    """Live: the tailer holds a partial record until the runtime writes its end, then the joined line is
    one timeout, attributed to the process, its pod and the runtime's time; nothing is read twice."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.write("/proc/sys/kernel/hostname", "gpu-0007\n")
    log = host.p(f"{POD_DIR}/0.log")
    log.parent.mkdir(parents=True)
    log.write_bytes(cri("stdout", "F", INIT) + cri("stderr", "P", WATCHDOG[:80]))
    c, sink = await _collector(host)
    assert any(g.startswith("/var/log/pods/") for g in c.tailer.globs)  # on, since /var/log/pods exists
    c.tailer.rescan()
    await c.tailer.pump(c._handle)
    assert sink.of("NCCLJobMember") and not sink.of("NCCLCollectiveTimeout")
    (tf,) = c.tailer.files.values()
    assert tf.offset == len(cri("stdout", "F", INIT))  # the partial record is held, not consumed
    await c.tailer.pump(c._handle)  # a wake-up with nothing new: not read again
    with open(log, "ab") as fh:
        fh.write(cri("stderr", "F", WATCHDOG[80:], "2026-12-03T10:30:01.000000000Z"))
    await c.tailer.pump(c._handle)
    (timeout,) = sink.of("NCCLCollectiveTimeout")
    assert timeout.entity == "nccl:llama-70b-worker-3:42" and timeout.details["world_rank"] == 3
    assert timeout.details["pod"] == "team-a/llama-70b-worker-3" and timeout.details["pod_uid"] == UID
    assert timeout.details["container"] == "pytorch"
    assert timeout.details["logged_at"] == "2026-12-03T10:30:00.100000000Z"
    assert tf.offset == log.stat().st_size and c.container_stats["joined"] == 1
    assert len(sink.of("NCCLJobMember")) == 1


async def test_pod_logs_can_be_turned_off(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.p(POD_DIR).mkdir(parents=True)
    c, _sink = await _collector(host, pod_logs="no")
    assert not any(g.startswith("/var/log/pods/") for g in c.tailer.globs)


async def test_nccl_debug_file_and_the_pods_pytorch_lines_are_one_process(tmp_path: Path) -> None:
    """NCCL_DEBUG_FILE=/var/log/nccl/%h.%p.log (a hostPath) holds NCCL's lines, the pod's container log
    PyTorch's: the watchdog line belongs to the process NCCL named by the pod's hostname, with its rank and
    job -- not to a process called "0" (the log file's name)."""
    host = SimHost.gpu_node(tmp_path / "h", gpus=8)
    host.write("/proc/sys/kernel/hostname", "gpu-0007\n")
    nccl = host.p("/var/log/nccl/llama-70b-worker-3.42.log")
    nccl.parent.mkdir(parents=True)
    other = INIT.replace("llama-70b-worker-3:42:57", "llama-70b-worker-30:42:57").replace("rank 3 ", "rank 30 ")
    nccl.write_text(INIT + "\n")
    host.write("/var/log/nccl/llama-70b-worker-30.42.log", other + "\n")  # another pod of the node, same pid
    pod_log = host.p(f"{POD_DIR}/0.log")
    pod_log.parent.mkdir(parents=True)
    pod_log.write_bytes(cri("stdout", "F", "epoch 3 step 100") + cri("stderr", "F", WATCHDOG))
    c, sink = await _collector(host, globs=["/var/log/nccl/*.log"])
    c.tailer.rescan()
    await c.tailer.pump(c._handle)
    (timeout,) = sink.of("NCCLCollectiveTimeout")
    assert timeout.entity == "nccl:llama-70b-worker-3:42"
    assert timeout.details["world_rank"] == 3 and timeout.details["job"] == "0x8b1f2e3d4c5b6a79"


# -- issue 24 (2): jobs named as operators name them ---------------------------------------------------------------

def test_a_pods_job_comes_from_the_labels_its_controller_sets() -> None:
    from collectors.nccl.job_identity import job_of_pod

    kubeflow = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama-70b", "controller": True}]
    assert job_of_pod("team-a", {"training.kubeflow.org/job-name": "llama-70b",
                                 "training.kubeflow.org/replica-type": "worker"}, kubeflow).name == (
        "team-a/llama-70b (PyTorchJob)")
    batch_owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": "pretrain-workers-0", "controller": True}]
    assert job_of_pod("ml", {"jobset.sigs.k8s.io/jobset-name": "pretrain",
                             "batch.kubernetes.io/job-name": "pretrain-workers-0"}, batch_owner).name == (
        "ml/pretrain (JobSet)")
    assert job_of_pod("ml", {"volcano.sh/job-name": "mpi-bench"}, []).name == "ml/mpi-bench (VolcanoJob)"
    assert job_of_pod("ml", {"batch.kubernetes.io/job-name": "sweep-3"}, batch_owner).name == "ml/sweep-3 (Job)"
    assert job_of_pod("ml", {}, [{"kind": "StatefulSet", "name": "trainer", "controller": True}]).name == (
        "ml/trainer (StatefulSet)")
    assert job_of_pod("ml", {}, []) is None
    # a label value no controller writes (upper case, markup) names nothing
    assert job_of_pod("ml", {"volcano.sh/job-name": "<script>"}, []) is None


# SchedMD/slurm src/scontrol/info_job.c (284c3b95f0), --oneliner: Key=Value pairs separated by one space
SCONTROL = ("JobId=1234 JobName=llama-pretrain UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A Priority=4294901 "
            "Nice=0 Account=research QOS=normal JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
            "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=01:02:03 TimeLimit=2-00:00:00 NodeList=gpu-[0001-0016] "
            "BatchHost=gpu-0001 NumNodes=16 NumCPUs=1536 NumTasks=128 WorkDir=/home/alice/llama "
            "StdErr=/home/alice/logs/llama-pretrain-1234.out StdIn=/dev/null "
            "StdOut=/home/alice/logs/llama-pretrain-1234.out Power=\n")


def test_scontrol_s_one_line_form_is_read() -> None:
    from collectors.nccl.job_identity import parse_scontrol, slurm_job

    fields = parse_scontrol(SCONTROL)
    assert fields["StdOut"] == "/home/alice/logs/llama-pretrain-1234.out" and fields["NumNodes"] == "16"
    job = slurm_job("1234", fields)
    assert (job.name, job.kind, job.owner) == ("slurm:1234 (llama-pretrain)", "slurm", "alice")


async def test_a_pod_log_process_is_named_by_its_training_job(tmp_path: Path) -> None:
    from tests.fake_kube import FakeKube

    kube = FakeKube().start()
    try:
        kube.add_pod("team-a", "llama-70b-worker-3", UID, labels={"training.kubeflow.org/job-name": "llama-70b"},
                     owners=[{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama-70b",
                              "uid": "j-1", "controller": True}])
        host = SimHost.gpu_node(tmp_path / "h", gpus=1)
        log = host.p(f"{POD_DIR}/0.log")
        log.parent.mkdir(parents=True)
        log.write_bytes(cri("stdout", "F", INIT))
        c, sink = await _collector(host, kubeconfig=str(kube.kubeconfig(tmp_path / "kubeconfig")), slurm="no")
        c.tailer.rescan()
        await c.tailer.pump(c._handle)
        await c.jobs.settle()
        assert ("GET", "/api/v1/namespaces/team-a/pods/llama-70b-worker-3", "") in kube.requests
        with open(log, "ab") as fh:
            fh.write(cri("stderr", "F", WATCHDOG))
        await c.tailer.pump(c._handle)
        (timeout,) = sink.of("NCCLCollectiveTimeout")
        assert timeout.details["job_name"] == "team-a/llama-70b (PyTorchJob)"
        assert timeout.details["job_kind"] == "PyTorchJob" and timeout.details["job"] == "0x8b1f2e3d4c5b6a79"
        # a pod the API server does not know (deleted, or another pod's UID): counted, the commId stands alone
        c.jobs.want_pod("team-a", "gone", "6f0c2f52-3a0e-4c1e-9a77-0c3f1b7d2e10")
        await c.jobs.settle()
        assert c.jobs.errors.get("api_404") == 1
    finally:
        kube.stop()


def _slurm_node(tmp_path: Path, monkeypatch: object) -> tuple[SimHost, Path]:
    """A Slurm node: process 4242 of job 1234 (its environment), NCCL_DEBUG_FILE, a recording scontrol."""
    import os
    import stat

    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    fake = bindir / "scontrol"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\ncat <<'EOF'\n{SCONTROL}EOF\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")  # type: ignore[attr-defined]
    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    host.write("/proc/sys/kernel/hostname", "gpu-0001\n")
    host.write("/proc/4242/environ", "SLURM_JOB_ID=1234\0SLURM_PROCID=3\0PATH=/usr/bin\0")
    host.write("/proc/4242/cgroup", "0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_3\n")
    log = host.p("/var/log/nccl/gpu-0001.4242.log")
    log.parent.mkdir(parents=True)
    log.write_text(INIT.replace("llama-70b-worker-3:42:57", "gpu-0001:4242:4250") + "\n")
    return host, calls


async def test_a_slurm_process_is_named_by_its_job(tmp_path: Path, monkeypatch: object) -> None:
    """SLURM_JOB_ID from the process's environment, then scontrol (a recording fake on PATH)."""
    host, calls = _slurm_node(tmp_path, monkeypatch)
    log = host.p("/var/log/nccl/gpu-0001.4242.log")
    c, sink = await _collector(host, pod_logs="no")
    c.tailer.rescan()
    await c.tailer.pump(c._handle)
    await c.jobs.settle()
    assert calls.read_text().split() == ["show", "job", "--oneliner", "1234"]
    with open(log, "a") as fh:
        fh.write("gpu-0001:4242:4250 [3] NCCL INFO comm 0x55d0c8b0 rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 5d000 "
                 "commId 0x1111222233334444 - Init COMPLETE\n")
    await c.tailer.pump(c._handle)
    named = [m for m in sink.of("NCCLJobMember") if m.details.get("job_name")]
    assert named and named[-1].details["job_name"] == "slurm:1234 (llama-pretrain)"
    assert named[-1].details["job_owner"] == "alice"


async def test_a_slurm_output_file_s_lines_belong_to_the_ranks_they_name(tmp_path: Path, monkeypatch: object) -> None:
    """One process, many files: NCCL's lines in NCCL_DEBUG_FILE, PyTorch's in the job's output file (srun
    --output=/home/alice/logs/%x-%j.out, torchrun's [rankN] prefix). Rank 3 runs here: its timeout is that
    process's; rank 40 runs on another node (no writer known here): counted as evidence for nobody, never a
    process of this one."""
    host, _calls = _slurm_node(tmp_path, monkeypatch)
    out = host.p("/home/alice/logs/llama-pretrain-1234.out")
    out.parent.mkdir(parents=True)
    out.write_text("step 100 loss 1.2\n" + WATCHDOG + "\n" + WATCHDOG.replace("[rank3]", "[rank40]")
                   .replace("[Rank 3]", "[Rank 40]") + "\n")
    c, sink = await _collector(host, pod_logs="no", globs=["/var/log/nccl/*.log", "/home/*/logs/*.out"])
    c.tailer.rescan()
    await c.tailer.pump(c._handle)  # the debug file's glob first, as NCCL's init precedes any timeout live
    timeouts = sink.of("NCCLCollectiveTimeout")
    assert [t.entity for t in timeouts] == ["nccl:gpu-0001:4242"]
    assert timeouts[0].details["world_rank"] == 3 and timeouts[0].details["rank"] == 3
    assert c.unattributed == 1 and c.foreign_lines == 0 and set(c.procs) == {"gpu-0001:4242"}


async def test_the_kubelets_rotation_while_the_agent_was_down_is_read_once(tmp_path: Path) -> None:
    """The agent stops half-way through 0.log; the kubelet renames it 0.log.<time> and later gzips it, and the
    runtime starts a new 0.log. On restart the rest of the old generation is read once -- from the renamed
    file by its inode, or from the .gz by its first bytes -- and older generations it never read are not."""
    import gzip
    import os

    from agent.emitter import CollectorEmitter, ConditionTracker
    from agent.facts import FactStore
    from collectors.nccl.plugin import NCCLLogsCollector, NCCLLogsConfig
    from gna_sdk.hostroot import HostRoot
    from tests.conftest import Sink

    host = SimHost.gpu_node(tmp_path / "h", gpus=1)
    state = tmp_path / "state"
    state.mkdir()
    d = host.p(POD_DIR)
    d.mkdir(parents=True)
    before = cri("stdout", "F", INIT)
    after = cri("stderr", "F", WATCHDOG)
    (d / "0.log").write_bytes(before)
    (d / "0.log.20261201-000000.gz").write_bytes(gzip.compress(cri("stderr", "F", WATCHDOG.replace("4712", "9"))))

    async def run(compress: bool) -> Sink:
        sink = Sink()
        em = CollectorEmitter("gpu-0007", "nccl_logs", sink, ConditionTracker(None), facts=FactStore(),
                              state_dir=state)
        c = NCCLLogsCollector(NCCLLogsConfig(flight_recorder=False), HostRoot(host.root), em)
        c.live = True
        c.tailer.load()
        c.tailer.rescan()
        await c.tailer.pump(c._handle)
        return sink

    for compress in (False, True):
        for f in d.iterdir():
            if f.name != "0.log.20261201-000000.gz":
                f.unlink()
        for f in state.iterdir():
            f.unlink()
        (d / "0.log").write_bytes(before)
        first = await run(compress)
        assert [m.type for m in first.messages] == ["NCCLJobMember"]
        with open(d / "0.log", "ab") as fh:  # written while the agent is down ...
            fh.write(after)
        os.rename(d / "0.log", d / "0.log.20261203-103000")  # ... then rotated
        if compress:
            rotated = d / "0.log.20261203-103000"
            (d / "0.log.20261203-103000.gz").write_bytes(gzip.compress(rotated.read_bytes()))
            rotated.unlink()
        (d / "0.log").write_bytes(cri("stdout", "F", "epoch 4"))
        second = await run(compress)
        timeouts = second.of("NCCLCollectiveTimeout")
        assert len(timeouts) == 1 and timeouts[0].details["seq_num"] == 4712, (compress, second.messages)
        third = await run(compress)  # and never again
        assert not third.of("NCCLCollectiveTimeout")


# -- issue 24 (3): the verdicts hold for every layout -----------------------------------------------------------

def _pytorch_timeout(rank: int, seq: int = 40) -> str:
    # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (2.5+ prefix), torchrun's [rankN]: per-rank prefix
    return (f"[rank{rank}]:[E1203 10:30:00.100000 77 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank "
            f"{rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
            f"NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.")


def _init(host: str, pid: int, rank: int, size: int, dev: int) -> str:
    # src/init.cc Init COMPLETE (2.21): "comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx commId 0x%llx"
    bus = ["18000", "2a000"][dev]
    return (f"{host}:{pid}:{pid + 9} [{dev}] NCCL INFO comm 0x55d0c8a{rank:x} rank {rank} nranks {size} cudaDev {dev} "
            f"nvmlDev {dev} busId {bus} commId 0x8b1f2e3d4c5b6a79 - Init COMPLETE")


def _progress(rank: int, seq: int = 40) -> str:
    # PyTorch 2.6+ (ProcessGroupNCCL.cpp, docs/formats.md "PyTorch PG status"): where the group failed
    return (f"[rank{rank}]:[E1203 10:30:00.200000 77 ProcessGroupNCCL.cpp:1684] [PG ID 0 PG GUID 0(default_pg) Rank "
            f"{rank}]  failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {seq}, "
            f"last completed work: {seq - 1}")


def _dump_signal(rank: int, enq: int = 39) -> str:
    # HeartbeatMonitor (2.4+): a rank that never entered the collective hears of the others' timeout
    return (f"[rank{rank}]:[E1203 10:30:01.000000 88 ProcessGroupNCCL.cpp:1431] [PG ID 0 PG GUID 0(default_pg) Rank "
            f"{rank}] Received a dump signal due to a collective timeout from rank 0 and we will try our best to dump "
            f"the debug info. Last enqueued NCCL work: {enq}, last completed NCCL work: {enq}.This is most likely "
            f"caused by incorrect usages of collectives, e.g., wrong sizes used across ranks.")


def _layout_nodes(tmp_path: Path, layout: str, hung: int, *, behind: bool = False) -> list[Path]:
    """Four nodes, two ranks each (8 ranks), NCCL's lines in NCCL_DEBUG_FILE, PyTorch's where the layout puts
    them: the pod's container log (Kubernetes) or the job's output file on each node (Slurm)."""
    roots = []
    for n in range(4):
        root = tmp_path / f"n{n}"
        host = SimHost.gpu_node(root, gpus=2)
        host.write("/etc/hostname", f"n{n}\n")
        host.write("/proc/sys/kernel/hostname", f"n{n}\n")
        pod = f"llama-70b-worker-{n}"
        uid = f"5f0c2f52-3a0e-4c1e-9a77-0c3f1b7d2e1{n}"
        nccl_host = pod if layout == "kubernetes" else f"n{n}"
        records: list[bytes] = []
        out: list[str] = []
        for local in range(2):
            rank, pid = 2 * n + local, 42 + local if layout == "kubernetes" else 4000 + local
            host.write(f"/var/log/nccl/{nccl_host}.{pid}.log", _init(nccl_host, pid, rank, 8, local) + "\n")
            if layout == "slurm":
                host.write(f"/proc/{pid}/environ", f"SLURM_JOB_ID=1234\0SLURM_PROCID={rank}\0")
                host.write(f"/proc/{pid}/cgroup", f"0::/system.slice/slurmstepd.scope/job_1234/step_0/task_{local}\n")
            if behind:  # every rank speaks; the one behind never entered collective 40
                lines = [_dump_signal(rank)] if rank == hung else [_pytorch_timeout(rank), _progress(rank)]
            else:  # the hung rank says nothing
                lines = [] if rank == hung else [_pytorch_timeout(rank)]
            records += [cri("stderr", "F", text) for text in lines]
            out += lines
        if layout == "kubernetes":
            d = host.p(f"/var/log/pods/team-a_{pod}_{uid}/pytorch")
            d.mkdir(parents=True)
            (d / "0.log").write_bytes(cri("stdout", "F", "step 100 loss 1.2") + b"".join(records))
        else:
            host.write("/home/alice/logs/llama-pretrain-1234.out", "step 100 loss 1.2\n" + "\n".join(out) + "\n")
        roots.append(root)
    return roots


@pytest.mark.parametrize(("layout", "behind"), [("kubernetes", False), ("slurm", False), ("kubernetes", True),
                                               ("slurm", True)], ids=["k8s-hung", "slurm-hung", "k8s-behind",
                                                                      "slurm-behind"])
def test_the_hung_rank_is_named_whatever_file_pytorch_wrote_to(tmp_path: Path, layout: str, behind: bool) -> None:
    """On a held-out set, every hung rank with NCCL_DEBUG_FILE and PyTorch's lines in another file got "no
    resource of the job stands out": the watchdog lines were not tied to their process. Now they are."""
    import asyncio

    from agent import config as configmod
    from agent.check import check_roots
    from fleet.correlator import correlate

    base = configmod.parse('[collectors.nccl_logs]\nglobs = ["/var/log/nccl/*.log", "/home/*/logs/*.out"]\n'
                           'slurm = "no"\nkube_api = "no"\n', file="<test>")
    reports = asyncio.run(check_roots(_layout_nodes(tmp_path, layout, hung=5, behind=behind), base))
    incidents = correlate([m for r in reports for m in r["conditions"] + r["events"]])
    (inc,) = incidents
    assert inc.culprit is not None, inc.reason
    assert (inc.culprit["node"], inc.culprit["entity"]) == ("n2", "rank:5"), inc.reason
    if behind:  # named by PyTorch's own numbers, not by its silence
        assert "never joined it" in inc.reason, inc.reason


async def test_a_slurm_job_s_output_files_are_followed_if_they_are_its_user_s(tmp_path: Path,
                                                                                monkeypatch: object) -> None:
    """scontrol's StdOut/StdErr (an sbatch pattern left unexpanded becomes a glob) are read without a glob for
    them in the configuration -- only files the job's user owns: a job pointing --output at another's file
    (or /etc/shadow) gets nothing read."""
    import os

    if os.geteuid() != 0:
        pytest.skip("giving the output file to another user (chown) needs root")
    host, _calls = _slurm_node(tmp_path, monkeypatch)
    out = host.p("/home/alice/logs/llama-pretrain-1234.out")
    out.parent.mkdir(parents=True)
    out.write_text(WATCHDOG + "\n")
    os.chown(out, 1000, 1000)  # alice's
    c, sink = await _collector(host, pod_logs="no")
    c.tailer.rescan()
    await c.tailer.pump(c._handle)
    await c.jobs.settle()
    (job,) = [j for k in ("slurm:1234",) if (j := c.jobs.get(k)) is not None]
    assert job.uid == 1000 and job.outputs == ("/home/alice/logs/llama-pretrain-1234.out",)
    with open(host.p("/var/log/nccl/gpu-0001.4242.log"), "a") as fh:  # a later message looks the files up
        fh.write("gpu-0001:4242:4250 [3] NCCL INFO NCCL_IB_HCA set to mlx5_0\n")
    await c.tailer.pump(c._handle)
    assert "/home/alice/logs/llama-pretrain-1234.out" in c.tailer.globs
    c.tailer.rescan()
    await c.tailer.pump(c._handle)
    (timeout,) = sink.of("NCCLCollectiveTimeout")
    assert timeout.entity == "nccl:gpu-0001:4242" and timeout.details["job_name"] == "slurm:1234 (llama-pretrain)"
    # the same job pointing at a file its user does not own: not followed, counted
    os.chown(out, 0, 0)
    c2, _sink2 = await _collector(host, pod_logs="no")
    c2.tailer.rescan()
    await c2.tailer.pump(c2._handle)
    await c2.jobs.settle()
    c2._follow_outputs(c2.jobs.get("slurm:1234"))  # type: ignore[arg-type]
    assert "/home/alice/logs/llama-pretrain-1234.out" not in c2.tailer.globs
    assert c2.jobs.errors.get("output_not_the_users") == 1
