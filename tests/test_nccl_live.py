"""collectors/nccl_live.py: the paths a job's environment names never lead the agent out of the host root."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from collectors.nccl_live import FlightRecords, contained, read_environ
from gna_sdk.hostroot import HostRoot


def test_dotdot_and_symlinks_out_of_the_root_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "tmp").mkdir(parents=True)
    outside = tmp_path / "secret"
    outside.write_text("x")
    (root / "tmp" / "escape").symlink_to(outside)
    (root / "tmp" / "inside").write_text("y")
    (root / "tmp" / "link_in").symlink_to(root / "tmp" / "inside")
    host = HostRoot(root)
    assert contained(host, "/tmp/escape") is None  # a symlink out of the root
    assert contained(host, "/../../secret") == root / "secret"  # ".." stops at the root, lexically
    assert contained(host, "/tmp/link_in") == root / "tmp" / "link_in"  # a symlink that stays inside is fine
    assert contained(host, "tmp/inside") == root / "tmp" / "inside"


def test_a_job_environment_cannot_point_the_agent_outside(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "proc" / "7").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "trace_0").write_bytes(b"\x80\x02}q\x00.")
    (root / "proc" / "7" / "environ").write_bytes(
        f"RANK=0\0TORCH_FR_DUMP_TEMP_FILE=/../../{tmp_path.name}/elsewhere/trace_\0".encode())
    os.symlink(tmp_path / "elsewhere", root / "data")
    (root / "proc" / "8").mkdir()
    (root / "proc" / "8" / "environ").write_bytes(b"RANK=0\0TORCH_FR_DUMP_TEMP_FILE=/data/trace_\0")
    fr = FlightRecords(HostRoot(root), emit=None)  # type: ignore[arg-type]
    assert fr.candidates(7, None) == [] and fr.candidates(8, None) == []


@given(st.binary(max_size=2048))
def test_any_environ_parses_to_strings(data: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "proc" / "1").mkdir(parents=True)
        (Path(d) / "proc" / "1" / "environ").write_bytes(data)
        env = read_environ(HostRoot(d), 1)
        assert env is not None and all(isinstance(k, str) and k and isinstance(v, str) for k, v in env.items())
        assert all("\0" not in k and "=" not in k for k in env)
