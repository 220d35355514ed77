"""Regenerate the Flight Recorder dumps in this folder with torch's own code.

Run with a torch that has ``torch._C._distributed_c10d._dump_fr_trace`` (2.8+; made with 2.13.0+cpu):

    python3.11 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch==2.13.0 numpy
    /tmp/torchenv/bin/python tests/corpus/flight_recorder/make_dumps.py [OUTDIR]

Two processes form a gloo process group over a TCPStore on 127.0.0.1 (nothing else is touched).
The pickle files are written by torch's own ``c10d::DebugInfoWriter`` (``getWriter(globalRank())``
then ``write(dump)``), the very calls ProcessGroupNCCL::dumpDebuggingInfo makes on a watchdog
timeout, so file name and bytes are what a hung job leaves behind. The CPU build has no
ProcessGroupNCCL and gloo has no dump-on-timeout, so the writer is reached through ctypes; the
dump itself is ``_dump_fr_trace(True, True, False)``, the arguments dumpDebuggingInfo passes.
The ``.json`` files are ``_dump_fr_trace_json(True, False)``: what the ``dump_nccl_trace_json``
control-plane handler serves.

Scenarios:
* ``hang_rank_{0,1}``: default PG (all_reduce x3, broadcast), a second PG (all_gather), a
  send/recv pair, a barrier; then rank 0 enqueues one more all_reduce that rank 1 never joins.
  Both ranks dump while rank 0 waits in it: rank 1 is the rank behind.
* ``wrap_rank_{0,1}``: a 4-entry ring (TORCH_FR_BUFFER_SIZE=4) after 10 all_reduces, without
  stack traces: the oldest entries are gone.
* ``default_location``: with no TORCH_FR_DUMP_TEMP_FILE the writer's default is
  ``${XDG_CACHE_HOME:-$HOME/.cache}/torch/comm_lib_trace_rank_<rank>``; the script checks that
  this is where torch wrote (the file itself is not kept).
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import pathlib
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
_GET_WRITER = "_ZN4c10d15DebugInfoWriter9getWriterEi"
_WRITE = "_ZN4c10d15DebugInfoWriter5writeERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"


class _StdString(ctypes.Structure):
    # libstdc++'s (C++11 ABI) std::string: pointer, length, then capacity or the SSO buffer.
    # DebugInfoWriter::write only reads data() and size(), so a borrowed buffer is safe.
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t), ("cap", ctypes.c_size_t),
                ("pad", ctypes.c_size_t)]


def torch_write(rank: int, data: bytes) -> None:
    """c10d::DebugInfoWriter::getWriter(rank).write(data), as dumpDebuggingInfo does."""
    lib = ctypes.CDLL(str(pathlib.Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    get_writer = getattr(lib, _GET_WRITER)
    get_writer.restype = ctypes.c_void_p
    get_writer.argtypes = [ctypes.c_int]
    write = getattr(lib, _WRITE)
    write.restype = None
    write.argtypes = [ctypes.c_void_p, ctypes.POINTER(_StdString)]
    buf = ctypes.create_string_buffer(data, len(data))
    s = _StdString(ctypes.cast(buf, ctypes.c_void_p).value, len(data), max(len(data), 15), 0)
    write(get_writer(rank), ctypes.byref(s))


def _fr() -> Any:
    import torch._C._distributed_c10d as c10d  # the 2.8+ names

    return c10d


def _init(rank: int, port: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))


def hang(rank: int, port: int, out: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "64"
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(out, "hang_rank_")
    _init(rank, port)
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    dist.broadcast(t, src=0)
    tp = dist.new_group([0, 1], group_desc="tp")
    dist.all_gather([torch.zeros(2), torch.zeros(2)], torch.ones(2), group=tp)
    if rank == 0:
        dist.send(torch.arange(3.0), dst=1)
    else:
        dist.recv(torch.zeros(3), src=0)
    dist.barrier()
    stuck = None
    if rank == 0:
        stuck = dist.all_reduce(torch.ones(8), async_op=True)  # rank 1 never joins (until after the dumps)
        store.set("enqueued", "1")
    else:
        store.wait(["enqueued"])
    c10d = _fr()
    torch_write(rank, c10d._dump_fr_trace(True, True, False))
    pathlib.Path(out, f"hang_rank_{rank}.json").write_bytes(c10d._dump_fr_trace_json(True, False))
    store.add("dumped", 1)
    while int(store.add("dumped", 0)) < WORLD:
        pass
    if rank == 1:
        dist.all_reduce(torch.ones(8))  # unblock rank 0 so both exit cleanly
    else:
        assert stuck is not None
        stuck.wait()
    dist.destroy_process_group()


def wrap(rank: int, port: int, out: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "4"
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(out, "wrap_rank_")
    _init(rank, port)
    t = torch.ones(2, 3)
    for _ in range(10):
        dist.all_reduce(t)
    c10d = _fr()
    torch_write(rank, c10d._dump_fr_trace(True, False, False))
    pathlib.Path(out, f"wrap_rank_{rank}.json").write_bytes(c10d._dump_fr_trace_json(True, False))
    dist.destroy_process_group()


def default_location(rank: int, port: int, out: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "8"
    os.environ.pop("TORCH_FR_DUMP_TEMP_FILE", None)
    os.environ.pop("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", None)
    os.environ["XDG_CACHE_HOME"] = os.path.join(out, f"xdg{rank}")
    _init(rank, port)
    dist.all_reduce(torch.ones(1))
    torch_write(rank, _fr()._dump_fr_trace(True, False, False))
    dist.destroy_process_group()
    where = pathlib.Path(out, f"xdg{rank}", "torch", f"comm_lib_trace_rank_{rank}")
    assert where.is_file(), f"torch did not write {where}"


def _worker(rank: int, scenario: str, port: int, out: str) -> None:
    {"hang": hang, "wrap": wrap, "default_location": default_location}[scenario](rank, port, out)


def run(scenario: str, out: str) -> None:
    master = dist.TCPStore("127.0.0.1", 0, WORLD + 1, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=60))
    mp.spawn(_worker, args=(scenario, master.port, out), nprocs=WORLD, join=True)


def main(argv: list[str]) -> int:
    out = argv[1] if len(argv) > 1 else str(pathlib.Path(__file__).parent)
    os.makedirs(out, exist_ok=True)
    run("hang", out)
    run("wrap", out)
    with tempfile.TemporaryDirectory() as tmp:
        run("default_location", tmp)
    meta = {"torch": torch.__version__, "git_version": torch.version.git_version}
    pathlib.Path(out, "generated_with.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
