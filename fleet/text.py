"""Wire text made safe to show: one rule for `top` (a terminal) and the dashboard (a browser).

Everything a node or a job sends (node names, entities, reasons, messages, job ids, details) can
hold characters that change how the text *around* them is shown rather than showing themselves:

- controls, Unicode category Cc: C0 (U+0000-U+001F, escape sequences start with ESC), DEL
  (U+007F) and C1 (U+0080-U+009F, CSI among them): a terminal obeys them;
- format characters, category Cf: LRM/RLM/ALM (U+200E, U+200F, U+061C), zero-width space /
  non-joiner / joiner (U+200B-U+200D), the BOM / zero-width no-break space (U+FEFF), the bidi
  embeddings and overrides (U+202A-U+202E) and isolates (U+2066-U+2069), soft hyphen, the tag
  characters (U+E0001, U+E0020-U+E007F) and the rest: "gpu-a" with an RLO reads as another node,
  a zero-width space makes two names that look the same;
- the rest of the tag block U+E0000-U+E007F (unassigned today, Cn), lone surrogates (Cs: JSON
  can carry "\\ud800"), and the line and paragraph separators U+2028/U+2029 (Zl, Zp: a new line
  inside one cell).

Each becomes U+FFFD, so what was there stays visible as "something was here". Text without any
of them passes unchanged. The set is computed from the running Python's unicodedata (categories
Cc, Cf, Cs, Zl, Zp) at import, over every code point that can hold one (planes 0-1 and 14).
"""

from __future__ import annotations

import datetime as dt
import re
import unicodedata
from typing import Any, Final

__all__ = ["ELLIPSIS", "REPLACEMENT", "UNSAFE_CATEGORIES", "clean_markup", "clean_text", "clean_tree", "is_unsafe",
           "shorten", "stamp"]

REPLACEMENT: Final = "\ufffd"
ELLIPSIS: Final = "\u2026"
UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_TAGS: Final = range(0xE0000, 0xE0080)


def is_unsafe(ch: str) -> bool:
    """The one-character rule the pattern below is built from (tests check the two agree)."""
    return unicodedata.category(ch) in UNSAFE_CATEGORIES or ord(ch) in _TAGS


def _ranges() -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for cp in [*range(0, 0x20000), *range(0xE0000, 0xE1000)]:
        if is_unsafe(chr(cp)):
            if out and out[-1][1] == cp - 1:
                out[-1] = (out[-1][0], cp)
            else:
                out.append((cp, cp))
    return out


def _char_class(ranges: list[tuple[int, int]]) -> str:
    def esc(cp: int) -> str:
        return f"\\U{cp:08x}"

    return "[" + "".join(esc(a) if a == b else f"{esc(a)}-{esc(b)}" for a, b in ranges) + "]"


_UNSAFE: Final = re.compile(_char_class(_ranges()))


def clean_text(value: Any) -> str:
    """``value`` as text (None is ""), each unsafe character replaced by U+FFFD."""
    text = "" if value is None else value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(REPLACEMENT, text)


def clean_tree(value: Any) -> Any:
    """A JSON-shaped value with every string in it cleaned, dict keys included; numbers, booleans and
    None as they are. What the dashboard sends the browser goes through this."""
    if isinstance(value, str):
        return _UNSAFE.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {(clean_text(k) if isinstance(k, str) else k): clean_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_tree(v) for v in value]
    return value


_MARKUP_KEEP: Final = frozenset("\t\n\r")


def clean_markup(markup: str) -> str:
    """Markup this side generated (the timeline SVG) with wire text inside: every unsafe character
    replaced except the tab, newline and carriage return that separate its own tags and attributes."""
    return _UNSAFE.sub(lambda m: m.group(0) if m.group(0) in _MARKUP_KEEP else REPLACEMENT, markup)


def shorten(value: Any, width: int) -> str:
    """``value`` as text of at most ``width`` characters: whole when it fits; otherwise cut after the
    last whole word that fits (mid-word only when no space falls in the second half) and ended with
    "…", so a cut message never reads as a complete one. Whitespace runs become one space first."""
    text = " ".join(("" if value is None else str(value)).split())
    if len(text) <= width:
        return text
    if width < 1:
        return ""
    room = text[:width - 1]  # the ellipsis takes the last character
    space = room.rfind(" ")
    if text[width - 1] == " ":  # the cut falls between two words
        space = width - 1
    if space >= width // 2:
        room = room[:space]
    return room.rstrip(" ,;:-") + ELLIPSIS


def stamp(epoch: float | None) -> str:
    """A time as every view prints it: UTC to the second, "2026-12-05 08:40:12Z" (the dashboard's pages
    format with stamp() in fleet/static/common.js, the same way); "?" for none."""
    if epoch is None:
        return "?"
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
