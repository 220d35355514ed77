"""NVIDIA's Xid catalog as data (collectors/formats/xid_catalog_data.py, generated from
collectors/formats/data/nvidia_xid_catalog.tsv) and how collectors/formats/xid_catalog.py grades an Xid with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.emitter import CollectorEmitter, ConditionTracker
from agent.facts import FactStore
from collectors.formats import xid_catalog_generate as gen
from collectors.formats.xid_catalog import UNKNOWN_NAME, classify, recovery_action
from collectors.formats.xid_catalog_data import BUCKET_GRADES, CATALOG
from collectors.kmsg_xid import KmsgXidCollector, KmsgXidConfig
from gna_sdk.hostroot import HostRoot
from sim.host import SimHost
from tests.conftest import Sink

KERNEL_CORPUS = Path(__file__).parent / "corpus" / "kernel"
HELD_OUT_154 = "GPU recovery action changed from 0x0 (None) to 0x2 (GPU Reset Required)"


def test_generated_module_is_what_the_saved_catalog_generates() -> None:
    assert gen.main(["--check"]) == 0, "python -m collectors.formats.xid_catalog_generate"


def test_saved_catalog_is_whole_and_says_where_it_came_from() -> None:
    header, rows = gen.read_tsv()
    assert any("docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in h for h in header)
    assert any(re.search(r"leptonai/gpud .*catalog_generated\.go \(commit [0-9a-f]{40}", h) for h in header)
    assert [r.code for r in rows] == list(range(1, 173)) and set(CATALOG) == set(range(1, 173))
    assert {r.immediate for r in rows} <= set(BUCKET_GRADES)  # every bucket has a decided grade


def test_every_kernel_log_xid_of_the_corpus_is_in_the_catalog() -> None:
    seen: dict[int, str] = {}
    for log in sorted(KERNEL_CORPUS.glob("*/input.log")):
        for m in re.finditer(r"NVRM: Xid \((?:PCI:)?[0-9a-fA-F:.]+[^)]*\): (\d+)", log.read_text(errors="replace")):
            seen.setdefault(int(m[1]), log.parent.name)
    assert len(seen) >= 10, seen
    missing = {code: case for code, case in seen.items() if code not in CATALOG}
    assert not missing, missing
    for code in seen:
        info = classify(code)
        assert info.known and info.name and not info.name.startswith("Xid "), (code, info)


def test_xid_154_is_graded_by_its_new_recovery_action() -> None:
    reset = classify(154, HELD_OUT_154)
    assert (reset.severity, reset.action, reset.nvidia_action, reset.fatal) == ("critical", "cordon", "RESET_GPU", True)
    assert "GPU Reset Required" in reset.name and reset.name.startswith("GPU Recovery Action Changed")
    reboot = classify(154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")
    assert (reboot.severity, reboot.action, reboot.nvidia_action, reboot.fatal) == ("critical", "reboot",
                                                                                    "RESTART_BM", True)
    assert classify(154, "GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)").action == "reboot"
    assert classify(154, "GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)").nvidia_action == "RESET_GPU"
    drain = classify(154, "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)")
    assert drain.fatal and drain.action == "cordon"
    # words this code does not know: the driver's number decides (NV2080_CTRL_GPU_RECOVERY_ACTION)
    assert recovery_action("recovery action changed from 0x0 (None) to 0x3 (P2P Drain Needed)") == (
        "P2P Drain Needed", "DRAIN_P2P")
    assert recovery_action("no action named here") is None


def test_xid_154_back_to_none_is_healthy_news() -> None:
    cleared = classify(154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")
    assert (cleared.severity, cleared.action, cleared.fatal) == ("info", "none", False)
    bare = classify(154)  # an NVML event has no text: the catalog's own bucket, never a cordon on it alone
    assert bare.known and bare.nvidia_action == "XID_154" and bare.action != "cordon" and not bare.fatal


def test_xid_38_has_its_catalog_description() -> None:
    info = classify(38)
    assert info.known and info.name == "Driver firmware error"
    assert (info.nvidia_action, info.severity, info.action) == ("IGNORE", "info", "none")


def test_the_hand_decided_grades_stay() -> None:
    def grade(code: int, text: str = "") -> tuple[str, str, bool]:
        i = classify(code, text)
        return i.severity, i.action, i.fatal

    for code in (13, 31, 43, 45, 68):
        assert grade(code) == ("warning", "none", False) and classify(code).application
    assert grade(79) == ("critical", "reboot", True) and classify(79).nvidia_action == "RESTART_BM"
    assert grade(48) == ("critical", "cordon", True) and classify(48).nvidia_action == "WORKFLOW_XID_48"
    assert grade(63) == grade(92) == ("info", "none", False)
    assert grade(64) == grade(95) == grade(119) == grade(120) == ("critical", "cordon", True)
    assert grade(74) == ("critical", "cordon", True)
    assert grade(94) == grade(69) == ("warning", "none", False)
    assert grade(61) == ("critical", "inspect_hardware", False)
    for code in range(144, 151):
        assert grade(code, "NETIR_LINK_EVT Fatal XC0 i0 Link 05 (0x00000000 0x00000000)") == (
            "critical", "cordon", True)
        assert grade(code, "RLW_CTRL Nonfatal XC0 i0 Link -1 (0x00000000 0x80000000)") == ("warning", "none", False)
        assert grade(code) == ("critical", "cordon", True)


def test_no_application_error_and_no_ignored_xid_ever_cordons() -> None:
    for e in CATALOG.values():
        if e.application or e.immediate in ("IGNORE", "RESTART_APP", ""):
            assert e.action != "cordon" and not e.fatal, e
        if e.fatal:
            assert e.severity == "critical" and e.action in ("cordon", "reboot"), e


def test_unknown_xid_is_reported_as_not_in_the_catalog() -> None:
    info = classify(999, "something new")
    assert not info.known and info.name == UNKNOWN_NAME and info.nvidia_action == "UNKNOWN"
    assert (info.severity, info.action, info.fatal) == ("warning", "inspect_hardware", False)


async def test_kernel_log_xids_come_out_with_catalog_words(tmp_path: Path) -> None:
    host = SimHost.gpu_node(tmp_path / "h", gpus=2)
    host.set_boot("b1", uptime=60)
    host.kmsg(f"NVRM: Xid (PCI:0000:18:00): 154, {HELD_OUT_154}", usec=50_000_000)
    host.kmsg("NVRM: Xid (PCI:0000:18:00): 999, pid=7, name=python3, a future Xid", usec=51_000_000)
    host.kmsg("NVRM: Xid (PCI:0000:18:00): 38, pid=7, name=python3, watchdog", usec=52_000_000)
    sink = Sink()
    em = CollectorEmitter("n", "kmsg_xid", sink, ConditionTracker(None), facts=FactStore(), state_dir=None)
    await KmsgXidCollector(KmsgXidConfig(), HostRoot(host.root), em).check()
    by = {(m.type, m.details.get("xid")): m for m in sink.messages}
    x154 = by[("GPUXidError", 154)]
    assert (x154.severity, x154.suggested_action, x154.reason) == ("critical", "cordon", "Xid154")
    assert "GPU Reset Required" in x154.message and "(Xid 154)" not in x154.message
    assert by[("GPUFatalXid", None)].reason == "Xid154"
    unknown = by[("GPUXidError", 999)]
    assert unknown.reason == "XidUnknown" and unknown.message.startswith(f"Xid 999: {UNKNOWN_NAME}")
    assert unknown.severity == "warning" and unknown.details["nvidia_action"] == "UNKNOWN"
    x38 = by[("GPUXidError", 38)]
    assert x38.severity == "info" and "Driver firmware error" in x38.message


@given(st.integers(min_value=0, max_value=2**32 - 1), st.text(max_size=600))
def test_classify_never_raises_and_stays_bounded(code: int, text: str) -> None:
    info = classify(code, text)
    assert len(info.name) <= 256 and 0 < len(info.nvidia_action) <= 64
    assert info.severity in ("info", "warning", "critical") and (info.action != "cordon" or info.severity == "critical")


@given(st.text(max_size=300), st.integers(0, 2**32 - 1))
def test_recovery_action_never_raises(words: str, number: int) -> None:
    for text in (words, f"GPU recovery action changed from 0x0 (None) to 0x{number:x} ({words})"):
        got = recovery_action(text)
        assert got is None or (len(got[0]) <= 64 and got[1] in BUCKET_GRADES)


@pytest.mark.parametrize("code", [13, 79, 154, 172])
def test_generator_refuses_an_ungraded_bucket(code: int) -> None:
    row = gen.Row(code, "M", "d", "SOME_NEW_BUCKET", "")
    if code in gen.HAND_GRADES:
        assert gen.grade_of(row)[2] == "hand"
    else:
        with pytest.raises(SystemExit):
            gen.grade_of(row)
