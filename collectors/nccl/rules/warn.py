"""Any other ``NCCL WARN`` line (src/debug.cc, level WARN) no rule explains: an ``NCCLWarning``, the first per
(process, text) at once, repeats within a window counted into one summary. Not in the ordered registry: it
is what a WARN line becomes when no rule matched (matching.match_or_reject), or besides a state rule's
match (the plugin: a WARN a state rule also reads, such as no libibverbs, is still shown as one)."""

from __future__ import annotations

import re

from collectors.nccl.rule import Fields, Heard, Rule, Said

WARN_NEEDLE = b"NCCL WARN"


def _say(_f: Fields, h: Heard) -> Said:
    text = h.msg[:300]
    return Said("NCCLWarning", "NCCLWarn", f"NCCL WARN in {h.process}: {text[:200]}", {"count": 1})


RULE = Rule("warn", re.compile(r"."), "NCCLWarning", {}, needles=(WARN_NEEDLE,), say=_say, repeats=True)
