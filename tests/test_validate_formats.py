"""The active checks' parsers (agent/validate/): each tool's real output, its failing forms, and garbage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.validate import dcgm_diag, nccl_tests, nvbandwidth, perftest

FAKES = Path(__file__).parent / "fakes" / "validate"
ANY_TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=2000)


def fake(tool: str, *args: str, **env: str) -> str:
    """What the recording fake prints: the tool's format, as its source prints it."""
    run = subprocess.run([sys.executable, str(FAKES / tool), *args], capture_output=True, text=True, timeout=10,
                         env={**{k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}, **env}, check=False)
    return run.stdout + run.stderr


# nccl-tests v2.19.6 src/util.cu with -I 1: per-iteration columns after each #wrong
V219_PER_ITER = """\
#
#                                                              out-of-place (+ per-iteration)                                in-place (+ per-iteration)
#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)              (us)     (us)     (us)      (%)     (us)  (GB/s)  (GB/s)              (us)     (us)     (us)      (%)
  1073741824     268435456     float     sum      -1   4072.1  263.68  461.44       0   4060.2   4090.3   4089.0     0.21   4071.9  263.70  461.47       0   4061.1   4089.9   4088.2     0.20
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 461.455
#
# Collective test concluded: all_reduce_perf
"""


def test_all_reduce_perf_pass_low_wrong_and_failures() -> None:
    ok = nccl_tests.parse(fake("all_reduce_perf", "-b", "1M", "-e", "16G", "-f", "2", "-g", "8"))
    assert len(ok.rows) == 15 and ok.wrong == 0 and ok.checked and ok.out_of_bounds == 0
    assert ok.largest is not None and ok.largest.size == 16 << 30
    assert ok.largest.busbw_oop == 480.12 and ok.largest.busbw_ip == 480.02  # busbw, not algbw (274.35)
    assert ok.avg_busbw is not None and 300 < ok.avg_busbw < 480 and not ok.failures
    wrong = nccl_tests.parse(fake("all_reduce_perf", "-g", "8", FAKE_ALL_REDUCE_PERF_MODE="wrong"))
    assert wrong.wrong == 6 and wrong.out_of_bounds == 2
    low = nccl_tests.parse(fake("all_reduce_perf", "-g", "8", FAKE_ALL_REDUCE_PERF_MODE="low"))
    assert low.largest is not None and low.largest.busbw is not None and low.largest.busbw < 151
    failed = nccl_tests.parse(fake("all_reduce_perf", "-g", "8", FAKE_ALL_REDUCE_PERF_MODE="nccl_error"))
    assert failed.rows == [] and len(failed.failures) == 2 and "Test NCCL failure" in failed.failures[0]
    unchecked = nccl_tests.parse(fake("all_reduce_perf", "-g", "2", FAKE_ALL_REDUCE_PERF_MODE="nocheck"))
    assert unchecked.rows and not unchecked.checked and unchecked.wrong == 0


def test_all_reduce_perf_columns_follow_the_header() -> None:
    res = nccl_tests.parse(V219_PER_ITER)
    assert len(res.rows) == 1 and res.rows[0].busbw_oop == 461.44 and res.rows[0].busbw_ip == 461.47
    assert res.rows[0].wrong_oop == 0 and res.rows[0].wrong_ip == 0 and res.avg_busbw == 461.455
    headless = nccl_tests.parse("    33554432       8388608     float     sum      -1    185.2  181.19  317.08      5"
                                "    184.9  181.48  317.59      0\n")
    assert headless.rows[0].busbw_ip == 317.59 and headless.wrong == 5


def test_nvbandwidth_matrices_status_and_sum() -> None:
    text = fake("nvbandwidth", "-t", "host_to_device_memcpy_ce", "device_to_device_memcpy_read_ce",
                FAKE_NVB_GPUS="4", FAKE_NVBANDWIDTH_MODE="low_p2p")
    res = nvbandwidth.parse(text)
    h2d = res.matrices["host_to_device_memcpy_ce"]
    assert h2d.columns == ["0", "1", "2", "3"] and h2d.measured() == [("0", c, 55.31) for c in "0123"]
    assert h2d.total == 221.24
    p2p = res.matrices["device_to_device_memcpy_read_ce"]
    assert len(p2p.measured()) == 12 and p2p.cells["1"]["2"] == 120.0 and p2p.cells["2"]["2"] is None
    assert res.status == {"host_to_device_memcpy_ce": "Running", "device_to_device_memcpy_read_ce": "Running"}
    err = nvbandwidth.parse(fake("nvbandwidth", "-t", "device_to_device_memcpy_read_ce",
                                 FAKE_NVBANDWIDTH_MODE="error"))
    assert "device_to_device_memcpy_read_ce" not in err.matrices
    assert err.status["device_to_device_memcpy_read_ce"].startswith("Error: cuMemcpyAsync failed")
    waived = nvbandwidth.parse("Running device_to_device_memcpy_read_ce.\nWaived: \n")
    assert waived.status == {"device_to_device_memcpy_read_ce": "Waived"} and not waived.matrices


def test_dcgm_diag_both_layouts() -> None:
    for mode, layout in (("pass", "dcgm4"), ("pass3", "dcgm3")):
        res = dcgm_diag.parse(fake("dcgmi", "diag", "-r", "2", "-j", FAKE_DCGMI_MODE=mode))
        assert res.layout == layout and len(res.tests) == 6 and not res.failed and res.error is None
    for mode in ("fail", "fail3"):
        res = dcgm_diag.parse(fake("dcgmi", "diag", "-r", "2", "-j", FAKE_DCGMI_MODE=mode))
        assert [(t.category, t.name) for t in res.failed] == [("Hardware", "memory")]
        assert res.failed[0].messages[0].startswith("GPU 2: A memory mismatch was detected")
    warn = dcgm_diag.parse(fake("dcgmi", "diag", "-r", "2", "-j", FAKE_DCGMI_MODE="warn"))
    assert not warn.failed and [t.name for t in warn.warned] == ["pcie"]
    rt = dcgm_diag.parse(fake("dcgmi", "diag", "-r", "2", "-j", FAKE_DCGMI_MODE="runtime_error"))
    assert rt.runtime_error is not None and "in use" in rt.runtime_error and rt.tests == []
    # DCGM 3.x level-one results put the message under "warnings" inside each warning entry
    v3 = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
        {"name": "Denylist", "results": [{"status": "Fail", "gpu_id": "0", "warnings": [
            {"warnings": "Found a denylisted driver: nouveau", "error_id": 1}]}]}]}]}}
    res = dcgm_diag.parse(json.dumps(v3))
    assert res.failed[0].messages == ["GPU 0: Found a denylisted driver: nouveau"]
    assert dcgm_diag.parse("Error: unable to connect").error == "no JSON object in the output"
    assert dcgm_diag.parse('{"x": 1}').error is not None and dcgm_diag.parse("[" * 100000 + "]" * 100000).error


def test_ib_write_bw_report_and_failures() -> None:
    res = perftest.parse(fake("ib_write_bw", "-d", "mlx5_3", "-s", "8388608", "--report_gbits", "--use_cuda=3",
                              "localhost"))
    assert res.unit == "Gb/sec" and res.rows[0].size == 8388608 and res.rows[0].iterations == 5000
    assert res.average_gbits == 392.51 and not res.failures
    low = perftest.parse(fake("ib_write_bw", "-s", "8388608", "localhost", FAKE_IB_WRITE_BW_MODE="low"))
    assert low.average_gbits == 97.3
    fail = perftest.parse(fake("ib_write_bw", "localhost", FAKE_IB_WRITE_BW_MODE="connect_fail"))
    assert fail.rows == [] and fail.failures == ["Couldn't connect to localhost:18515",
                                                 "Unable to init the socket connection"]
    mbs = perftest.parse(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
                         " 65536      5000             11800.00            11750.00\t\t   0.188000\n")
    assert mbs.average_gbits is not None and abs(mbs.average_gbits - 11750 * 1048576 / 125e6) < 1e-9


@settings(max_examples=150, deadline=None)
@given(ANY_TEXT)
def test_parsers_never_raise_on_garbage(text: str) -> None:
    nccl = nccl_tests.parse(text)
    assert nccl.wrong >= 0 and all(r.busbw is None or r.busbw >= 0 for r in nccl.rows)
    nvb = nvbandwidth.parse(text)
    assert all(v >= 0 for m in nvb.matrices.values() for _, _, v in m.measured())
    dcgm = dcgm_diag.parse(text)
    assert dcgm.error is not None or dcgm.layout is not None
    ib = perftest.parse(text)
    assert ib.average_gbits is None or ib.average_gbits >= 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([*V219_PER_ITER.splitlines(), "", "# Out of bounds values : 7 FAILED", "12 x",
                                 "  8  2  float  sum  -1  1.0  nan  inf  N/A"]),
                max_size=40))
def test_nccl_tests_shuffled_lines(lines: list[str]) -> None:
    res = nccl_tests.parse("\n".join(lines))
    assert len(res.rows) <= len(lines)
    for r in res.rows:
        assert r.size >= 0 and (r.busbw is None or r.busbw >= 0)


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                        st.sampled_from(["DCGM Diagnostic", "DCGM GPU Diagnostic", "test_categories", "tests",
                                         "results", "status", "warnings", "warning", "name", "category",
                                         "test_summary", "entity_id", "gpu_id", "runtime_error"]), inner,
                        max_size=5), max_leaves=40))
def test_dcgm_diag_any_json_shape(doc: object) -> None:
    res = dcgm_diag.parse(json.dumps(doc))
    for t in res.tests:
        assert t.status in ("pass", "fail", "warn", "skip", "not_run", "unknown")
        assert len(t.messages) <= dcgm_diag.MAX_MESSAGES


def test_bounds() -> None:
    row = "  1048576  262144  float  sum  -1  10.0  100.0  175.0  0  10.0  100.0  175.0  0\n"
    res = nccl_tests.parse(row * (nccl_tests.MAX_ROWS + 10))
    assert len(res.rows) == nccl_tests.MAX_ROWS and res.truncated
    assert nvbandwidth.parse("x" * (nvbandwidth.MAX_BYTES + 1)).truncated
    assert dcgm_diag.parse(" " * (dcgm_diag.MAX_BYTES + 1)).error is not None
