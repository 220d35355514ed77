"""NCCL lines rendered from the format strings at each release tag (NVIDIA/nccl, read with `git show
<tag>:<path>`; docs/formats.md cites each), and lines as they arrive in the field behind a prefix."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from collectors.nccl.line import parse_line
from collectors.nccl.matching import match_line
from collectors.nccl.prefilter import candidate_lines
from collectors.nccl.process import ProcessState
from sim.host import SimHost
from tests.conftest import AGENT_CMD

P = "node-a:1234:1300 [0] NCCL INFO "

# (tag, source, the line as the format renders it, rule, fields that must hold)
FORMATS: list[tuple[str, str, str, str, dict[str, object]]] = [
    # src/transport/net.cc v2.4.8-1 L306: "Ring %02d : %d -> %d [send] via NET/%s/%d%s" (ranks, no brackets)
    ("v2.4.8-1", "net.cc", P + "Ring 00 : 0 -> 8 [send] via NET/IB/0", "channel_net",
     {"net": "IB", "dev": "0", "flags": ""}),
    ("v2.4.8-1", "net.cc", P + "Ring 01 : 8 -> 0 [receive] via NET/IB/1/GDRDMA", "channel_net",
     {"net": "IB", "flags": "/GDRDMA"}),
    # shm.cc v2.4.8-1 L152: "Ring %02d : %d[%d] -> %d[%d] via direct shared memory"
    ("v2.4.8-1", "shm.cc", P + "Ring 00 : 0[0] -> 1[1] via direct shared memory", "channel_shm", {"src": "0"}),
    # net_ib.cc v2.4.8-1 L226
    ("v2.4.8-1", "net_ib.cc", P + "NET/IB : GPU Direct RDMA Disabled for GPU 0[0] / HCA 0 'mlx5_0' (no module or "
     "not supported by GPU)", "gdr", {"state": "Disabled", "hca": "0", "name": "mlx5_0"}),
    # net_ib.cc v2.4.8-1 L789 (<= v2.9.9): no "from peer"
    ("v2.4.8-1", "net_ib.cc", "node-a:1234:1300 [0] transport/net_ib.cc:789 NCCL WARN NET/IB : Got completion with "
     "error 12, opcode 0, len 0, vendor err 129", "ib_completion", {"status": 12, "vendor_err": 129}),
    # net_ib.cc v2.4.8-1 L168: "NET/IB : Using%s ; OOB %s:%s"
    ("v2.4.8-1", "net_ib.cc", P + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>", "ib_using",
     {"oob": "ib0:10.0.0.1<0>"}),
    # shm.cc v2.7.8-1 L78 / v2.11.4-1 L77: busId in hex, "via direct shared memory"
    ("v2.7.8-1", "shm.cc", P + "Channel 00 : 0[18000] -> 1[2a000] via direct shared memory", "channel_shm", {}),
    # net_ib.cc v2.7.8-1 L239: "NET/IB : GPU Direct RDMA Disabled for HCA %d '%s' (no module)"
    ("v2.7.8-1", "net_ib.cc", P + "NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_1' (no module)", "gdr",
     {"state": "Disabled", "name": "mlx5_1"}),
    # net.cc v2.11.4-1 L120: "Channel %02d : %d[%lx] -> %d[%lx] [send] via NET/%s/%d%s%s"
    ("v2.11.4-1", "net.cc", P + "Channel 02 : 0[18000] -> 8[18000] [send] via NET/Socket/0", "channel_net",
     {"net": "Socket"}),
    # net_ib.cc v2.11.4-1 L883: "... Got completion from peer %s with error %d, opcode %d, len %d, vendor err %d"
    ("v2.11.4-1", "net_ib.cc", "node-a:1234:1300 [0] transport/net_ib.cc:883 NCCL WARN NET/IB : Got completion from "
     "peer 10.0.0.9<33092> with error 12, opcode 0, len 0, vendor err 129", "ib_completion",
     {"peer": "10.0.0.9<33092>", "status": 12}),
    # shm.cc v2.18.6-1 L95: "Channel %02d : %d[%d] -> %d[%d] via SHM/%s/%s" (no /connIndex)
    ("v2.18.6-1", "shm.cc", P + "Channel 00 : 1[1] -> 2[2] via SHM/direct/direct", "channel_shm",
     {"mode": "direct/direct"}),
    # topo.cc v2.18.6-1 L643: "NET/%s : GPU Direct RDMA %s for HCA %d '%s'"
    ("v2.18.6-1", "topo.cc", P + "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'", "gdr", {"name": "mlx5_0"}),
    # net.cc v2.18.6-1 L189 (PXN): "... [send] via NET/%s/%d(%d)%s%s"
    ("v2.18.6-1", "net.cc", P + "Channel 03/1 : 0[0] -> 8[0] [send] via NET/IB/0(1)", "channel_net",
     {"net": "IB", "flags": ""}),
    # net_ib.cc v2.18.6-1 L180: "NCCL_IB_HCA set to %s"
    ("v2.18.6-1", "net_ib.cc", P + "NCCL_IB_HCA set to mlx5", "env_hca", {"value": "mlx5"}),
    # param.cc v2.18.6-1 L75: "%s set by environment to %lld."
    ("v2.18.6-1", "param.cc", P + "NCCL_IB_DISABLE set by environment to 1.", "env_param",
     {"name": "NCCL_IB_DISABLE", "value": "1"}),
    # init.cc v2.21.5-1 L322 with the Mellanox plugin's versioned name (nccl-rdma-sharp-plugins ib_plugin.c)
    ("v2.21.5-1", "init.cc", P + "Using network IBext_v8", "network", {"net": "IBext_v8"}),
    # net_ib.cc v2.24.3-1 L2244: "NET/IB: Got completion from peer %s with status=%d opcode=%d len=%u ..."
    ("v2.24.3-1", "net_ib.cc", "node-a:1234:1300 [0] transport/net_ib.cc:2244 NCCL WARN NET/IB: Got completion from "
     "peer 10.0.0.9<33092> with status=5 opcode=0 len=0 vendor err 249 (Recv) localGid ::ffff:10.0.0.1 "
     "remoteGids::ffff:10.0.0.9 hca mlx5_1", "ib_completion", {"status": 5, "hca": "mlx5_1"}),
    # net.cc v2.28.9-1 L313: "... via NET/%s/%d%s%s%s" with "(PCI)" after /GDRDMA
    ("v2.28.9-1", "net.cc", P + "Channel 00/0 : 1[1] -> 9[1] [send] via NET/IB/0/GDRDMA(PCI)", "channel_net",
     {"flags": "/GDRDMA(PCI)"}),
    # net_ib.cc v2.28.9-1 L2543: "status=%s(%d) opcode=%s(%d) ..."
    ("v2.28.9-1", "net_ib.cc", "[2026-03-03 12:11:38] node-a:1234:1300 [0] transport/net_ib.cc:2543 NCCL WARN NET/IB:"
     " Got completion from peer 10.0.0.9<33092> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) "
     "reqSize=0 vendor_err=129 req_type=Send hca mlx5_1", "ib_completion",
     {"status": 12, "sname": "IBV_WC_RETRY_EXC_ERR", "vendor_err": 129}),
    # shm.cc v2.30.7-1 L116: "Channel %02d : %d[%d] -> %d[%d] via SHM/direct"
    ("v2.30.7-1", "shm.cc", P + "Channel 01 : 1[1] -> 2[2] via SHM/direct", "channel_shm", {"mode": "direct"}),
    # pytorch ProcessGroupNCCL.cpp (2.1.0 literals; order from main@0007e752): "[Rank ", rank, "] Watchdog caught
    # collective operation timeout: WorkNCCL(SeqNum=.., OpType=.., NumelIn=.., NumelOut=.., Timeout(ms)=..) ran for
    # .. milliseconds before timing out." — no NCCL prefix: the line belongs to the file's %h.%p
    ("torch-2.1.0", "ProcessGroupNCCL.cpp", "[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective "
     "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, "
     "Timeout(ms)=600000) ran for 600081 milliseconds before timing out.", "watchdog",
     {"seq": "1", "op": "BROADCAST", "timeout": "600000", "ran": "600081"}),
    # torch 2.14.1: per-work prefix "[PG GUID <uid>(<desc>) Rank <r>] " behind c10 logging's "[rankN]:[E...]"
    ("torch-2.14.1", "ProcessGroupNCCL.cpp", "[rank3]:[E1218 20:27:21.426451 ProcessGroupNCCL.cpp:632] [PG GUID "
     "0(default_pg) Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4712, OpType=ALLREDUCE, "
     "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.", "watchdog",
     {"seq": "4712", "op": "ALLREDUCE", "rank": 3}),
    # PyTorch's process-group progress when its watchdog fails (collectors/nccl/rules/, docs/formats.md
    # "PyTorch PG status"); lines as printed in public logs of each release
    ("torch-2.3", "ProcessGroupNCCL.cpp", "[rank1]:[E ProcessGroupNCCL.cpp:1540] [PG 1 Rank 1] Timeout at NCCL work: "
     "7, last enqueued NCCL work: 8, last completed NCCL work: 6.", "pg_progress",
     {"pg": "1", "pg_rank": 1, "rank": 1, "at": 7, "enq": 8, "done": 6}),  # torchrun's [rank1]: is the world rank
    ("torch-2.3", "ProcessGroupNCCL.cpp", "[PG 3 Rank 0] Timeout at NCCL work: 7, last enqueued NCCL work: 8, last "
     "completed NCCL work: 6.", "pg_progress", {"pg": "3", "pg_rank": 0, "rank": None}),  # a subgroup's rank only
    ("torch-2.3", "ProcessGroupNCCL.cpp", "[rank2]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 2] Timeout at NCCL work: "
     "1, last enqueued NCCL work: 1, last completed NCCL work: 76280750235782912.", "pg_progress",
     {"at": 1, "enq": 1, "done": None, "implausible": True}),  # uninitialised memory, as printed
    ("torch-2.4", "ProcessGroupNCCL.cpp", "[rank1]:[E1003 18:37:01.833575187 ProcessGroupNCCL.cpp:1664] [PG 0 "
     "(default_pg) Rank 1] Exception (either an error or timeout) detected by watchdog at work: 6463, last enqueued "
     "NCCL work: 6463, last completed NCCL work: 6462.", "pg_progress",
     {"pg": "0", "desc": "default_pg", "rank": 1, "at": 6463, "enq": 6463, "done": 6462}),
    ("torch-2.6", "ProcessGroupNCCL.cpp", "[rank368]:[E808 04:21:41.161005534 ProcessGroupNCCL.cpp:2299] [PG ID 0 PG "
     "GUID 0(default_pg) Rank 368]  failure detected by watchdog at work sequence id: 5 PG status: last enqueued "
     "work: 5, last completed work: 4", "pg_progress", {"pg": "0", "guid": "0", "rank": 368, "at": 5, "enq": 5,
                                                        "done": 4}),
    ("torch-2.6", "ProcessGroupNCCL.cpp", "[rank4]:[E703 15:37:17.178360488 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG "
     "GUID 0(default_pg) Rank 4] Received a dump signal due to a collective timeout from  rank 7 and we will try our "
     "best to dump the debug info. Last enqueued NCCL work: 56118, last completed NCCL work: 56118.This is most "
     "likely caused by incorrect usages of collectives", "pg_dump_signal",
     {"rank": 4, "src": 7, "enq": 56118, "done": 56118}),
    ("torch-2.14.1", "ProcessGroupNCCL.cpp", "[PG GUID 5(tp) Rank 3] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=4712, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 "
     "milliseconds before timing out.", "watchdog", {"guid": "5", "desc": "tp", "pg_rank": 3, "rank": None}),
    # Mellanox/nccl-rdma-sharp-plugins p2p_plugin.c L312 (HEAD 2f5ac02): the closing quote is missing in the source
    ("plugin", "p2p_plugin.c", P + "NET/IB : GPU Direct RDMA (nvidia-peermem) enabled for HCA 0 'mlx5_0", "gdr",
     {"state": "enabled", "name": "mlx5_0"}),
]


@pytest.mark.parametrize(("tag", "src", "line", "rule", "fields"), FORMATS,
                         ids=[f"{t}-{s}-{i}" for i, (t, s, *_rest) in enumerate(FORMATS)])
def test_each_format_at_its_tag(tag: str, src: str, line: str, rule: str, fields: dict[str, object]) -> None:
    data = line.encode() + b"\n"
    cands = candidate_lines(data, 0)
    assert len(cands) == 1
    m = match_line(parse_line(0, data.rstrip(b"\n")))
    assert m is not None and m.rule.name == rule, (m and m.rule.name)
    for k, v in fields.items():
        assert m.fields.get(k) == v, (k, m.fields)


def test_ib_plugin_channels_without_gdrdma_are_counted() -> None:
    st = ProcessState("node-a", 1234, "f")
    data = "".join(raw + "\n" for raw in (P + "Using network IBext_v8",
                                          P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IBext_v8/0",
                                          P + "Channel 01/0 : 0[0] -> 8[0] [send] via NET/IBext_v8/1/GDRDMA"))
    cands = candidate_lines(data.encode(), 0)
    assert len(cands) == 3
    for cand in cands:
        m = match_line(parse_line(*cand))
        assert m is not None
        st.apply(m)
    assert st.non_gdr_channels == 1 and st.transport() == "IBext_v8"
    assert st.channel_devs == {0, 1}


def test_the_nics_a_rank_uses_come_from_its_channels_through_nccls_own_index() -> None:
    """NET/IB/<n> indexes NCCL's device list ("NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB"), not mlx5_<n>."""
    st = ProcessState("node-a", 1234, "f")
    data = "".join(raw + "\n" for raw in (
        P + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [2]mlx5_4:1/RoCE ; OOB ib0:10.0.0.1<0>",
        P + "Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/1/GDRDMA",
        P + "Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/2/GDRDMA(PCI)",
        P + "Channel 02/0 : 0[0] -> 1[1] via P2P/CUMEM/read"))
    for cand in candidate_lines(data.encode(), 0):
        if (m := match_line(parse_line(*cand))) is not None:
            st.apply(m)
    assert st.summary()["nics"] == ["mlx5_3/1", "mlx5_4/1"]
    st.channel_devs.add(7)  # an index NCCL never listed (a plugin's numbering): unknown, not a guess
    assert st.summary()["nics"] is None


def test_nccl_2_4_rings_over_ib_are_not_a_socket_fallback() -> None:
    # 2.4 prints no "Using network"; its socket line appears in every process (the bootstrap)
    st = ProcessState("node-a", 1234, "f")
    for raw in (P + "NET/Socket : Using [0]eth0:10.0.0.1<0>",
                P + "NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>",
                P + "Ring 00 : 0 -> 8 [send] via NET/IB/0/GDRDMA"):
        m = match_line(parse_line(0, raw.encode()))
        assert m is not None
        st.apply(m)
    assert st.transport() == "IB"
    st2 = ProcessState("node-a", 1235, "f")
    m = match_line(parse_line(0, (P + "Ring 00 : 0 -> 8 [send] via NET/Socket/0").encode()))
    assert m is not None
    st2.apply(m)
    assert st2.transport() == "Socket", "sockets visible only on ring/channel lines"


@pytest.mark.parametrize("prefix", [
    "",
    "worker-3: ",  # pdsh / a launcher's host prefix
    "[1,0]<stdout>:",  # Open MPI --tag-output
    "2026-05-01T10:00:00.123456789Z ",  # kubectl logs --timestamps
    "Dec  2 10:00:00 gpu-7 python[1234]: ",  # syslog
    "  3%|▎         | 30/1000 [00:10<05:00,  3.2it/s]\r",  # tqdm junk before a carriage return
])
def test_lines_behind_any_prefix(prefix: str) -> None:
    line = f"{prefix}node-a:1234:1300 [0] NCCL INFO Using network Socket"
    m = match_line(parse_line(0, line.encode()))
    assert m is not None and m.rule.name == "network" and m.line.host == "node-a" and m.line.pid == 1234


@pytest.mark.parametrize("pid", ["<pid>", "xxx", "***"])
def test_a_redacted_pid_still_parses(pid: str) -> None:
    m = match_line(parse_line(0, f"node-a:{pid}:{pid} [0] NCCL INFO NET/IB : No device found.".encode()))
    assert m is not None and m.rule.name == "ib_no_device" and m.line.host == "node-a" and m.line.pid == 0


# -- the policy through `check`: who is at fault decides severity and action ------------------------------
def _check_nccl(tmp: Path, log: str, environ: str | None = None, hcas: int = 8) -> list[dict[str, object]]:
    host = SimHost.gpu_node(tmp / "host", gpus=8, hcas=hcas)
    (host.p("/var/log/nccl")).mkdir(parents=True)
    host.p("/var/log/nccl/node-a.1234.log").write_text(log)
    host.write("/proc/sys/kernel/hostname", "node-a\n")  # the job's lines are this node's
    if environ is not None:
        host.write("/proc/1234/environ", environ)
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(host.root), "--format", "json"],
                       capture_output=True, text=True, timeout=120)
    report = json.loads(r.stdout)
    return [c for c in report["conditions"] if c["type"] == "NCCLSocketFallback"]


SOCKET_JOB = ("node-a:1234:1234 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
              "node-a:1234:1234 [0] NCCL INFO Using network Socket\n"
              "node-a:1234:1300 [0] NCCL INFO comm 0x55 rank 3 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 "
              "commId 0x1 - Init COMPLETE\n")


def test_ib_disabled_by_the_job_is_a_fix_config_warning_never_a_cordon(tmp_path: Path) -> None:
    log = "node-a:1234:1234 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.\n" + SOCKET_JOB
    (c,) = _check_nccl(tmp_path, log)
    assert (c["severity"], c["suggested_action"], c["reason"]) == ("warning", "fix_config", "SocketChosenByJob")
    assert "NCCL_IB_DISABLE=1" in str(c["message"]) and "ranks [3]" in str(c["message"])


def test_nccl_net_socket_from_the_environ_is_the_job_s_choice(tmp_path: Path) -> None:
    (c,) = _check_nccl(tmp_path, SOCKET_JOB, environ="NCCL_DEBUG=INFO\0NCCL_NET=Socket\0")
    assert c["reason"] == "SocketChosenByJob" and c["suggested_action"] == "fix_config"


def test_unexplained_socket_on_an_ib_node_is_critical_but_not_a_cordon(tmp_path: Path) -> None:
    (c,) = _check_nccl(tmp_path, SOCKET_JOB)
    assert (c["severity"], c["suggested_action"]) == ("critical", "inspect_hardware")


def test_golden_2_4_style_ib_job_has_no_fallback(tmp_path: Path) -> None:
    log = ("node-a:1234:1234 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
           "node-a:1234:1234 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>\n"
           "node-a:1234:1300 [0] NCCL INFO Ring 00 : 0 -> 8 [send] via NET/IB/0/GDRDMA\n")
    assert _check_nccl(tmp_path, log) == []


def test_check_runs_a_copied_golden_too(tmp_path: Path) -> None:
    # the fixed 2.28 golden's SHM lines (no /connIndex) reach NCCLP2PViaHost
    host = SimHost.gpu_node(tmp_path / "host", gpus=8, hcas=2)
    host.p("/var/log/nccl").mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "golden" / "nccl" / "2.28.log", host.p("/var/log/nccl/node-d.55.log"))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[collectors.nccl_logs]\nnvlink = "yes"\nown_hosts = ["*"]\n')  # copied: judged as this node's
    r = subprocess.run([*AGENT_CMD, "check", "--host-root", str(host.root), "--config", str(cfg), "--format", "json"],
                       capture_output=True, text=True, timeout=120)
    types = {c["type"] for c in json.loads(r.stdout)["conditions"]}
    assert "NCCLP2PViaHost" in types
