"""The RAS corpus (tests/corpus/ras/): job states, what NCCL's RAS thread prints for them (tests/ras_render.py, from
the format strings of NVIDIA/nccl src/ras/client_support.cc at each tag), and what a reader must find in it.

The expectations are written from the job state, by hand, not from the parser. ``python -m tests.ras_corpus``
rewrites the transcripts and their .expect.json; test_nccl_ras.py checks the files match the renderer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.ras_render import Comm, Job, Peer, Rank, hgx_job, render_json, render_text, world

CORPUS = Path(__file__).parent / "corpus" / "ras"

W = 0x5B1E0C3F9A7D2E41  # the 32-rank world communicator of the 4-node jobs
SUB = [0x8E3A55D0C47B1900 + 0x1011 * g for g in range(8)]  # 4-rank "same GPU index on each node" communicators
NODE = [0x2C9F4A7710E3B600 + 0x0707 * n for n in range(4)]  # 8-rank intra-node communicators
IP = ["10.10.1.10", "10.10.1.11", "10.10.1.12", "10.10.1.13"]


def pid(node: int, gpu: int) -> int:
    return 4000 + 100 * node + gpu


def four_nodes(counts: tuple[int, int, int, int, int] = (2, 0, 14, 0, 1200), *, subs: bool = True,
               nodes: bool = False) -> tuple[list[Peer], list[Comm]]:
    peers = hgx_job(4, base="10.10.1.")
    comms = [world(peers, W, counts=counts)]
    if subs:  # GPU g of every node; rank n is on node n
        comms += [Comm(SUB[g], [Rank(n, 8 * n + g, g, counts=(0, 0, 0, 0, 300)) for n in range(4)]) for g in range(8)]
    if nodes:
        comms += [Comm(NODE[n], [Rank(g, 8 * n + g, g, counts=(0, 0, 0, 0, 77)) for g in range(8)]) for n in range(4)]
    return peers, comms


@dataclass
class Case:
    name: str  # file stem; the tag it follows comes first
    job: Job
    gen: int
    verbose: bool = False
    fmt: str = "text"
    expect: dict[str, Any] = field(default_factory=dict)
    about: str = ""

    @property
    def path(self) -> Path:
        return CORPUS / f"{self.name}.{'json' if self.fmt == 'json' else 'txt'}"

    def render(self) -> str:
        return render_json(self.job) if self.fmt == "json" else render_text(self.job, gen=self.gen, verbose=self.verbose)


def _cases() -> list[Case]:
    out: list[Case] = []

    # --- 2.24 / 2.25 -------------------------------------------------------------------------------------------
    peers, comms = four_nodes()
    out.append(Case("v2.24.3-healthy", Job(peers, comms, nccl="2.24.3", cuda="12.6", runtime=12060, driver=12060), 24,
                    about="4 nodes x 8 GPUs, a 32-rank communicator and eight 4-rank ones, all running",
                    expect={"nccl_version": "2.24.3", "healthy": True, "complete": True, "comm_count": 9,
                            "job": [4, 32, 32], "groups": [[1, 32, "RUNNING", []], [8, 4, "RUNNING", []]],
                            "comms": {}, "suspects": []}))

    peers, comms = four_nodes()
    out.append(Case("v2.24.3-missing-rank", Job(peers, comms, unresponsive={21}, timeouts=2, seconds=2.05,
                                                nccl="2.24.3", cuda="12.6"), 24,
                    about="the process of rank 21 (node 10.10.1.12, GPU 5) stopped answering; RAS timed out twice",
                    expect={"healthy": False, "complete": True, "timeouts": 2, "collection_time_s": 2.05,
                            "missing_processes": [[IP[2], pid(2, 5), [5]]],
                            "groups": [[1, 32, "RUNNING", ["INCOMPLETE"]], [7, 4, "RUNNING", []],
                                       [1, 4, "RUNNING", ["INCOMPLETE"]]],
                            "comms": {W: {"label": "#0-0", "nranks": 32, "errors": ["INCOMPLETE"], "missing_count": 1,
                                          "missing": [[21]]},
                                      SUB[5]: {"label": "#2-0", "nranks": 4, "errors": ["INCOMPLETE"],
                                               "missing_count": 1, "missing": [[2]]}},
                            "suspects": [["unresponsive", None, None, IP[2], pid(2, 5)]]}))

    peers, comms = four_nodes()
    out.append(Case("v2.24.3-dead", Job(peers, comms, dead={21}, nccl="2.24.3", cuda="12.6"), 24,
                    about="60 s later: RAS declared that process dead",
                    expect={"dead_processes": [[IP[2], pid(2, 5), [5]]], "missing_processes": [], "timeouts": 0,
                            "comms": {W: {"errors": ["INCOMPLETE"], "missing": [[21]]},
                                      SUB[5]: {"errors": ["INCOMPLETE"], "missing": [[2]]}},
                            "suspects": [["dead", None, None, IP[2], pid(2, 5)]]}))

    peers, comms = four_nodes(subs=False)
    w = comms[0]
    keep = {0, 8, 16, 24, 4, 20}
    for r in w.ranks:
        r.nocomm = r.rank not in keep
        r.finalize = r.rank in (4, 20)
        r.counts = (0, 0, 0, 0, 499 if r.rank == 8 else 500)
    out.append(Case("v2.25.1-teardown-verbose", Job(peers, comms, nccl="2.25.1", cuda="12.8"), 24, verbose=True,
                    about="VERBOSE STATUS while the world communicator is torn down: 26 ranks already gone (UNKNOWN),"
                          " 2 finalizing, rank 8 one collective behind",
                    expect={"nccl_version": "2.25.1", "comms": {W: {
                        "label": "#0-0", "errors": ["MISMATCH"], "status": "FINALIZE", "missing": [],
                        "status_groups": [["UNKNOWN", 26, []], ["RUNNING", 4, [0, 8, 16, 24]], ["FINALIZE", 2, [4, 20]]],
                        "ops": {"collective": [[500, 5, [0, 4, 16, 20, 24]], [499, 1, [8]]]}}},
                        "suspects": [["behind", W, 8, IP[1], pid(1, 0)]]}))

    # --- 2.26 - 2.28.3 -----------------------------------------------------------------------------------------
    peers, comms = four_nodes(nodes=True)
    out.append(Case("v2.26.6-healthy-multi", Job(peers, comms, nccl="2.26.6", cuda="12.8"), 26,
                    about="13 communicators (world, per-GPU-index, per-node), all running",
                    expect={"nccl_version": "2.26.6", "healthy": True, "comm_count": 13,
                            "groups": [[1, 32, "RUNNING", []], [4, 8, "RUNNING", []], [8, 4, "RUNNING", []]],
                            "comms": {}, "suspects": []}))

    peers, comms = four_nodes(nodes=True)
    out.append(Case("v2.26.6-missing-rank", Job(peers, comms, unresponsive={21}, timeouts=2, seconds=2.05,
                                                nccl="2.26.6", cuda="12.8"), 26,
                    about="rank 21's process stopped answering; 2.26 names each missing rank's GPU, process and node",
                    expect={"missing_processes": [[IP[2], pid(2, 5), [5]]], "timeouts": 2,
                            "comms": {W: {"errors": ["INCOMPLETE"], "missing_count": 1,
                                          "missing": [[21, IP[2], pid(2, 5), 5]]},
                                      SUB[5]: {"errors": ["INCOMPLETE"], "missing": [[2, IP[2], pid(2, 5), 5]]},
                                      NODE[2]: {"errors": ["INCOMPLETE"], "nranks": 8,
                                                "missing": [[5, IP[2], pid(2, 5), 5]]}},
                            "suspects": [["unresponsive", None, None, IP[2], pid(2, 5)]]}))

    peers, comms = four_nodes()
    for r in comms[0].ranks:
        r.async_err = 2 if r.rank == 13 else 6 if r.rank in (5, 21, 29) else 0
    sub3 = next(c for c in comms if c.hash == SUB[3])
    sub3.ranks[1].init = 3
    out.append(Case("v2.26.6-errors", Job(peers, comms, nccl="2.26.6", cuda="12.8"), 26,
                    about="rank 13 hit a system error and three ranks report the remote failure; a 4-rank communicator"
                          " failed to initialise on its rank 1",
                    expect={"comms": {
                        W: {"errors": ["ERROR"], "async_error_count": 4,
                            "error_groups": [["async", "Remote process error", 6, 3, [5, 21, 29]],
                                             ["async", "System error", 2, 1, [13]]]},
                        SUB[3]: {"errors": ["ERROR", "MISMATCH"], "init_error_count": 1, "status": "RUNNING",
                                 "error_groups": [["init", "Internal error", 3, 1, [1]]],
                                 "status_groups": [["RUNNING", 3, []], ["INIT", 1, [1]]]}},
                        "suspects": [["error", W, 13, IP[1], pid(1, 5)], ["error", SUB[3], 1, IP[1], pid(1, 3)]]}))

    peers, comms = four_nodes(subs=False)
    for r in comms[0].ranks:
        r.counts = (0 if r.rank in (30, 31) else 1, 0, 14, 0, 1199 if r.rank == 9 else 1200)
    out.append(Case("v2.27.7-straggler", Job(peers, comms, nccl="2.27.7", cuda="12.9"), 26,
                    about="rank 9 has launched one AllReduce fewer than the other 31; ranks 30 and 31 never broadcast",
                    expect={"nccl_version": "2.27.7", "comms": {W: {"errors": ["MISMATCH"], "ops": {
                        "Broadcast": [[1, 30, []], [0, 2, [30, 31]]],
                        "AllReduce": [[1200, 31, []], [1199, 1, [9]]]}}},
                        "suspects": [["behind", W, 30, IP[3], pid(3, 6)], ["behind", W, 31, IP[3], pid(3, 7)],
                                     ["behind", W, 9, IP[1], pid(1, 1)]]}))

    peers, comms = four_nodes(subs=False)
    for r in comms[0].ranks:
        r.nocomm = r.rank not in {0, 8, 16, 24, 4, 20}
        r.finalize = r.rank in (4, 20)
    out.append(Case("v2.27.7-nocomm-verbose", Job(peers, comms, nccl="2.27.7", cuda="12.9"), 26, verbose=True,
                    about="the teardown of v2.25.1-teardown-verbose as 2.26+ prints it (NOCOMM)",
                    expect={"comms": {W: {"errors": ["MISMATCH"], "missing": [], "status_groups": [
                        ["NOCOMM", 26, []], ["RUNNING", 4, [0, 8, 16, 24]], ["FINALIZE", 2, [4, 20]]]}},
                        "suspects": []}))

    peers = [Peer(f"10.10.3.{10 + n}", 7000 + 100 * n + g, (g,), port=40000 + g) for n in range(3)
             for g in range(8 if n < 2 else 7)]
    out.append(Case("v2.28.3-uneven-nodes", Job(peers, [world(peers, 0x77D0F00D12345678)], nccl="2.28.3",
                                                cuda="12.9"), 26,
                    about="a node runs 7 processes where the others run 8 (job summary layout with outlier nodes)",
                    expect={"nccl_version": "2.28.3", "job": [3, 23, 23], "job_ppn": [[2, 8], [1, 7]],
                            "outlier_nodes": ["10.10.3.12"], "healthy": True}))

    peers = ([Peer("10.10.4.10", 8000 + g, (g,), port=40000 + g) for g in range(8)]
             + [Peer("10.10.4.11", 8100 + g, (2 * g, 2 * g + 1), port=40000 + g) for g in range(4)])
    ranks = [Rank(g, g, g) for g in range(8)] + [Rank(8 + i, 8 + i // 2, i) for i in range(8)]
    out.append(Case("v2.28.3-two-gpus-per-process", Job(peers, [Comm(0x0DDBA11C0FFEE123, ranks)], unresponsive={9},
                                                        nccl="2.28.3", cuda="12.9"), 26,
                    about="processes of the second node drive two GPUs each; one of them stopped answering",
                    expect={"job": [2, 12, 16], "job_gpp": [[8, 1], [4, 2]],
                            "missing_processes": [["10.10.4.11", 8101, [2, 3]]],
                            "comms": {0x0DDBA11C0FFEE123: {"errors": ["INCOMPLETE"], "missing_count": 2,
                                                           "missing": [[10, "10.10.4.11", 8101, 2],
                                                                       [11, "10.10.4.11", 8101, 3]]}}}))

    # --- 2.28.7+ (text with 3 decimals; JSON) -----------------------------------------------------------------
    for fmt in ("text", "json"):
        peers, comms = four_nodes(nodes=True)
        job = Job(peers, comms, unresponsive={21}, timeouts=2, seconds=2.046, nccl="2.28.9", cuda="13.0",
                  runtime=13000, driver=13000)
        miss = {"missing_processes": [[IP[2], pid(2, 5), [5]]], "timeouts": 2, "collection_time_s": 2.046,
                "comms": {W: {"errors": ["INCOMPLETE"], "missing": [[21, IP[2], pid(2, 5), 5]]},
                          SUB[5]: {"errors": ["INCOMPLETE"], "missing": [[2, IP[2], pid(2, 5), 5]]},
                          NODE[2]: {"errors": ["INCOMPLETE"], "missing": [[5, IP[2], pid(2, 5), 5]]}},
                "suspects": [["unresponsive", None, None, IP[2], pid(2, 5)]]}
        if fmt == "json":
            miss |= {"notes": 1, "comm_count": 13, "warnings": []}
        out.append(Case("v2.28.9-missing-rank", job, 28, fmt=fmt, expect=miss,
                        about="rank 21's process stopped answering" + (
                            "; the JSON lacks the comma after each missing rank's nvml_dev (2.28.7-2.28.9)"
                            if fmt == "json" else "")))

    peers, comms = four_nodes(subs=True)
    out.append(Case("v2.28.7-healthy", Job(peers, comms, nccl="2.28.7", cuda="13.0", runtime=13000, driver=13000,
                                           seconds=0.004), 28, fmt="json",
                    about="the first JSON release, nothing missing (so the comma bug does not show)",
                    expect={"nccl_version": "2.28.7", "healthy": True, "comm_count": 9, "notes": 0, "suspects": []}))

    peers, comms = four_nodes(subs=True)
    for r in comms[0].ranks:
        r.async_err = 2 if r.rank == 13 else 6 if r.rank == 5 else 0
        r.counts = (0, 0, 14, 0, 1199 if r.rank == 9 else 1200)
    sub2 = next(c for c in comms if c.hash == SUB[2])
    sub2.ranks[3].nocomm = True
    out.append(Case("v2.29.7-mixed", Job(peers, comms, dead={21}, unresponsive={30}, timeouts=1, seconds=5.012,
                                         nccl="2.29.7", cuda="13.0", runtime=13000, driver=13010), 28, fmt="json",
                    about="one process dead, one not answering, errors, a straggler and a rank that left a"
                          " communicator, as one JSON document",
                    expect={"nccl_version": "2.29.7", "timeouts": 1, "notes": 0,
                            "dead_processes": [[IP[2], pid(2, 5), [5]]],
                            "missing_processes": [[IP[3], pid(3, 6), [6]]],
                            "comms": {W: {"errors": ["INCOMPLETE", "ERROR", "MISMATCH"], "ranks_reporting": 30,
                                          "missing": [[21, IP[2], pid(2, 5), 5, True], [30, IP[3], pid(3, 6), 6, False]],
                                          "error_groups": [["async", "System error", 2, 1, [13]],
                                                           ["async", "Remote process error", 6, 1, [5]]],
                                          "ops": {"AllReduce": [[1200, 29, None], [1199, 1, [9]]]}},
                                      SUB[2]: {"errors": ["MISMATCH"], "missing": [],
                                               "not_member": [[3, IP[3], pid(3, 2), 2]]},
                                      SUB[5]: {"errors": ["INCOMPLETE"], "missing": [[2, IP[2], pid(2, 5), 5, True]]}},
                            "suspects": [["dead", None, None, IP[2], pid(2, 5)]]}))

    for fmt in ("text", "json"):
        peers, comms = four_nodes(subs=False)
        for r in comms[0].ranks:
            r.async_err = 8 if r.rank in (3, 11) else 6 if r.rank == 7 else 0
        exp: dict[str, Any] = {"nccl_version": "2.30.7", "dead_processes": [[IP[3], pid(3, 1), [1]]]}
        if fmt == "text":  # rasClientBreakDownErrors never lists ncclTimeout (8): counted, not named
            exp["comms"] = {W: {"errors": ["INCOMPLETE", "ERROR"], "async_error_count": 3, "missing": [[25, IP[3], pid(3, 1), 1, True]],
                                "error_groups": [["async", "Remote process error", 6, 1, [7]]]}}
        else:
            exp["comms"] = {W: {"errors": ["INCOMPLETE", "ERROR"], "async_error_count": 3,
                                "missing": [[25, IP[3], pid(3, 1), 1, True]],
                                "error_groups": [["async", "Timeout", 8, 2, [3, 11]],
                                                 ["async", "Remote process error", 6, 1, [7]]]}}
        out.append(Case("v2.30.7-dead-and-timeouts", Job(peers, comms, dead={25}, nccl="2.30.7", cuda="13.1",
                                                         runtime=13010, driver=13010, seconds=0.012), 28,
                        verbose=True, fmt=fmt,
                        about="a dead process, and two ranks whose async error is ncclTimeout (new in 2.30; the text"
                              " report counts them but lists no rank for them)", expect=exp))

    peers = hgx_job(2, base="10.10.5.")
    out.append(Case("v2.30.7-no-communicators", Job(peers, [], nccl="2.30.7", cuda="13.1"), 28,
                    about="every communicator already destroyed", expect={"comm_count": 0, "groups": [], "healthy": True}))
    return out


CASES = _cases()


def expect_json(case: Case) -> str:
    def conv(x: Any) -> Any:
        if isinstance(x, dict):
            return {(f"{k:016x}" if isinstance(k, int) else k): conv(v) for k, v in x.items()}
        if isinstance(x, list):
            return [conv(v) for v in x]
        if isinstance(x, int) and not isinstance(x, bool) and x > 2**40:
            return f"{x:016x}"
        return x

    return json.dumps({"about": case.about, "generation": case.gen, "verbose": case.verbose, **conv(case.expect)},
                      indent=1) + "\n"


def main() -> None:
    for case in CASES:
        case.path.write_text(case.render())
        (CORPUS / f"{case.name}.{case.fmt}.expect.json").write_text(expect_json(case))


if __name__ == "__main__":
    main()
