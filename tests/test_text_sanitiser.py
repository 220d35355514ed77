"""#20 deliver 5: `top` and the dashboard show wire text without its controls (Cc) or format characters (Cf: bidi
overrides and isolates, LRM/RLM/ALM, zero-width characters, the BOM, tag characters) -- one rule, fleet/text.py."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import unicodedata
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from agent.message import rfc3339
from fleet.dashboard import make_app
from fleet.state import FleetState
from fleet.text import ELLIPSIS, REPLACEMENT, clean_markup, clean_text, clean_tree, is_unsafe, shorten
from fleet.top import plain, render, render_incidents

# Every character the issue names, and the C0/C1/DEL controls
NAMED = ["\u200e", "\u200f", "\u061c", "\u200b", "\u200c", "\u200d", "\ufeff", "\U000e0001", "\U000e0041",
         "\U000e007f", "\U000e0000", "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068",
         "\u2069", "\x00", "\x1b", "\t", "\n", "\r", "\x7f", "\x85", "\x9b", "\u2028", "\u2029", "\u00ad"]


def _forbidden(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Cs") or 0xE0000 <= ord(c) <= 0xE007F
            or c in "\u2028\u2029"]


def test_every_named_character_is_replaced_and_the_pattern_agrees_with_unicodedata() -> None:
    for ch in NAMED:
        assert clean_text(f"a{ch}b") == f"a{REPLACEMENT}b", hex(ord(ch))
    # the compiled class is exactly the per-character rule, over every code point it was built from and beyond
    for cp in [*range(0, 0x3000), *range(0xFE00, 0x10000), *range(0xE0000, 0xE0100), 0x110BD, 0x1D173, 0x10FFFF]:
        ch = chr(cp)
        assert (clean_text(ch) != ch) == is_unsafe(ch), hex(cp)
    assert clean_text(None) == "" and clean_text(42) == "42"


ANY_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()),
                   max_size=60)


@settings(max_examples=500)
@given(ANY_TEXT)
def test_output_never_holds_a_control_or_format_character(text: str) -> None:
    out = clean_text(text)
    assert _forbidden(out) == []
    assert len(out) == len(text)  # one for one: what was there stays visible as U+FFFD
    assert all(o in (t, REPLACEMENT) for o, t in zip(out, text, strict=True))


@given(st.text(alphabet=st.characters(exclude_categories=("Cc", "Cf", "Cs", "Zl", "Zp", "Cn")), max_size=60))
def test_plain_text_passes_unchanged(text: str) -> None:
    assert clean_text(text) == text
    assert clean_tree({text: [text, 1, None, True]}) == {text: [text, 1, None, True]}


@given(st.recursive(st.one_of(ANY_TEXT, st.integers(), st.none(), st.booleans()),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(ANY_TEXT, kids, max_size=4),
                    max_leaves=20))
def test_every_string_in_a_json_tree_is_cleaned(tree: Any) -> None:
    out = json.loads(json.dumps(clean_tree(tree)))

    def strings(v: Any) -> list[str]:
        if isinstance(v, str):
            return [v]
        if isinstance(v, dict):
            return [s for k, x in v.items() for s in [k, *strings(x)]]
        if isinstance(v, list):
            return [s for x in v for s in strings(x)]
        return []

    assert all(_forbidden(s) == [] for s in strings(out))


def test_markup_keeps_its_own_whitespace() -> None:
    assert clean_markup('<g>\n<text x="1">a\u202eb\x1b</text>\t</g>') == f'<g>\n<text x="1">a{REPLACEMENT}b{REPLACEMENT}</text>\t</g>'


HOSTILE = "gpu-a\u202e\u2066\u200b\ufeff\U000e0067\x1b[2J\x9b31m\u061c"


def _fleet() -> FleetState:
    st_ = FleetState()
    st_.apply_state({"node": HOSTILE, "time": rfc3339(), "heartbeat_interval": 10, "agent_version": "0.1\u200f",
                     "conditions": [{"collector": "c", "type": "IBPortDown\u200d", "entity": "ib:mlx5_0\u2067/1",
                                     "severity": "critical", "reason": "R\u202d", "message": "m\u2028x",
                                     "since": rfc3339()}]})
    return st_


def test_top_renders_no_control_or_format_character() -> None:
    buf = io.StringIO()
    Console(file=buf, width=300, color_system=None).print(render(_fleet(), fit=False))
    out = buf.getvalue()
    assert "gpu-a" in out and _forbidden(out.replace("\n", "")) == []
    assert plain("[red]x\u202e").plain == f"[red]x{REPLACEMENT}"  # no markup either
    assert render_incidents(FleetState()) is None


async def test_what_the_browser_gets_holds_none_of_them() -> None:
    """Every body the pages fetch (overview, node, stats, the SSE frames, the timeline SVG), read as the
    browser reads it: JSON decoded (its \\u escapes undone), SVG as text."""
    state = _fleet()
    client = TestClient(TestServer(make_app(state)))
    await client.start_server()
    try:
        overview = await (await client.get("/api/overview")).json()
        names = [r["node"] for r in overview["nodes"]]
        assert len(names) == 1 and names[0].startswith("gpu-a") and _forbidden(names[0]) == []
        node = await client.get("/api/node/" + quote(HOSTILE, safe=""))
        assert node.status == 200
        detail_text = await node.text()
        assert _forbidden(json.dumps(await node.json(), ensure_ascii=False)) == [], detail_text[:200]
        stats = await (await client.get("/api/stats")).json()
        assert _forbidden(json.dumps(stats, ensure_ascii=False)) == []
        svg_resp = await client.get("/api/node/" + quote(HOSTILE, safe="") + "/timeline.svg")
        svg = await svg_resp.text()
        assert "<svg" in svg and _forbidden(svg.replace("\n", "").replace("\t", "").replace("\r", "")) == []
        stream = await client.get("/api/stream")
        assert (await stream.content.readline()).startswith(b": connected")
        state.apply_state({"node": "gpu-b\u202e\u200b", "time": rfc3339(), "heartbeat_interval": 10,
                           "agent_version": "x", "conditions": []})
        frame = b""
        async with asyncio.timeout(5):
            while not frame.startswith(b"data: "):
                frame = await stream.content.readline()
        rows = json.loads(frame[len(b"data: "):])
        assert rows and all(_forbidden(json.dumps(r, ensure_ascii=False)) == [] for r in rows)
        assert any(r["node"] == f"gpu-b{REPLACEMENT}{REPLACEMENT}" for r in rows)
        stream.close()
    finally:
        await client.close()


def test_the_sanitiser_has_one_home() -> None:
    """top and the dashboard share fleet/text.py; neither keeps a rule of its own."""
    import fleet.dashboard
    import fleet.top

    for mod in (fleet.top, fleet.dashboard):
        src = Path(sys.modules[mod.__name__].__file__ or "").read_text(encoding="utf-8")
        assert "from fleet.text import" in src and "\\x7f" not in src and "\\u202a" not in src


def test_shorten_cuts_at_a_word_and_always_says_so() -> None:
    """Issue 22 item 8: the demo cut messages mid-word with nothing to show they were cut."""
    msg = "nvidia_peermem is not loaded on a node with 8 GPUs and 8 RDMA HCAs: GPUDirect RDMA is off"
    assert shorten(msg, len(msg)) == msg and shorten(msg, 200) == msg
    assert shorten(msg, 40) == "nvidia_peermem is not loaded on a node…"
    assert shorten(msg, 72) == "nvidia_peermem is not loaded on a node with 8 GPUs and 8 RDMA HCAs…"  # no "HCAs:…"
    assert shorten("x" * 50, 10) == "x" * 9 + ELLIPSIS, "no space to cut at: mid-word, still marked"
    assert shorten("ab cd ef", 6) == "ab cd" + ELLIPSIS and shorten(None, 5) == ""


@given(st.text(alphabet=st.sampled_from("ab :,\n"), max_size=60), st.integers(1, 40))
def test_shorten_is_a_marked_prefix_never_longer_than_asked(text: str, width: int) -> None:
    out, flat = shorten(text, width), " ".join(text.split())
    assert len(out) <= width
    if out.endswith(ELLIPSIS) and flat != out:
        assert flat.startswith(out[:-1])
    else:
        assert out == flat
