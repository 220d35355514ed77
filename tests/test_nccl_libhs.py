"""The system's Hyperscan library through ctypes (collectors/nccl/libhs.py): the same matches as the wheel and the
regular expression, from any thread, and refusals answered, not crashed on. Skipped, with the reason, where the
library is not installed (Debian and Ubuntu: libhyperscan5; .ci/run installs it on x86_64)."""

from __future__ import annotations

import re
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.nccl import libhs
from collectors.nccl.prefilter import KIND_BITS, NEEDLE_KIND, NEEDLES, PREFILTER, engine, hits

SYSTEM = libhs.compile_literals([re.escape(n) for n in NEEDLES], [NEEDLE_KIND[n] for n in NEEDLES])
pytestmark = pytest.mark.skipif(SYSTEM is None, reason="libhs.so.5 (Debian/Ubuntu libhyperscan5) is not installed "
                                                       "or does not load on this machine")
PIECES = [*NEEDLES, b"\n", b" ", b"step 1 | loss 2.3", b"\xff\x00", b"NET/", b"via ", b"NCCL INFO "]


def _regex_ends(data: bytes) -> list[int]:
    """Every end of every needle, overlapping ones too (what Hyperscan reports), by brute force."""
    return sorted(i + len(n) for n in NEEDLES for i in range(len(data)) if data.startswith(n, i))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=60))
def test_the_system_library_reports_every_needle_end_with_its_kind(parts: list[bytes]) -> None:
    assert SYSTEM is not None
    data = b"".join(parts)
    got = SYSTEM.hits(data, KIND_BITS)
    assert got == sorted(got)
    assert [h >> KIND_BITS for h in got] == _regex_ends(data)
    for h in got:
        end, kind = h >> KIND_BITS, h & ((1 << KIND_BITS) - 1)
        assert kind in {NEEDLE_KIND[n] for n in NEEDLES if data[:end].endswith(n)}
    assert {data.rfind(b"\n", 0, (h >> KIND_BITS) - 1) + 1 for h in got} == {
        data.rfind(b"\n", 0, m.end() - 1) + 1 for m in PREFILTER.finditer(data)}


def test_the_engine_named_hyperscan_is_the_system_library_here() -> None:
    assert isinstance(engine("hyperscan"), libhs.SystemHyperscan)
    assert "Version: 5." in engine("hyperscan").info()


def test_threads_scan_at_once_each_with_its_scratch() -> None:
    """A scratch space serves one scan at a time (hs_scan answers HS_SCRATCH_IN_USE otherwise): one per thread."""
    assert SYSTEM is not None
    data = b"".join(b"line %d via NET/IB/%d/GDRDMA\nstep %d | loss\n" % (i, i % 8, i) for i in range(20000))
    want = SYSTEM.hits(data, KIND_BITS)
    got: list[list[int]] = []
    errors: list[BaseException] = []

    def scan() -> None:
        try:
            for _ in range(5):
                got.append(SYSTEM.hits(data, KIND_BITS))
        except BaseException as exc:  # the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=scan) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == 20 and all(g == want for g in got)
    assert hits(data, "hyperscan") == want


def test_a_pattern_the_compiler_refuses_is_an_answer_not_a_crash() -> None:
    with pytest.raises(libhs.HsError, match="hs_compile_multi"):
        libhs.SystemHyperscan(libhs._load(), [b"(unclosed"], [0])  # type: ignore[arg-type]
    assert libhs.compile_literals([b"(unclosed"], [0]) is None
