"""A line against the registry: the first rule that matches, a rejection, or an NCCLWarning.

A line with a field past its bound (line.PREFIX_MAX, each rule's ``fields``) is Rejected whatever rule it
would feed: no id is cut out of a field longer than NCCL or PyTorch print.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from collectors.nccl.bounds import DEFAULT_FIELD_MAX
from collectors.nccl.line import Line
from collectors.nccl.rule import Rule
from collectors.nccl.rules import RULES, WARNING_RULE

REJECTED_SOURCE = "NCCL lines with a field longer than NCCL or PyTorch print (rejected)"
UNREAD_SOURCE = "NCCLX lines (glog header) whose NCCL part cannot be read"


@dataclass(frozen=True)
class Match:
    rule: Rule
    line: Line
    fields: dict[str, Any]


@dataclass(frozen=True)
class Rejected:
    """A line whose ``field`` is ``length`` characters where NCCL/PyTorch print at most ``limit``."""

    line: Line
    rule: str  # the rule that matched, or "prefix"
    field: str
    length: int
    limit: int


def field_bounds() -> dict[str, int]:
    """Every field any rule yields -> its tightest bound (for documentation and tests)."""
    out: dict[str, int] = {}
    for r in (*RULES, WARNING_RULE):
        for k, v in r.fields.items():
            out[k] = min(out.get(k, v), v)
    return out


def _over(rule: Rule, fields: dict[str, Any]) -> tuple[str, int, int] | None:
    for k, v in fields.items():
        limit = rule.fields.get(k, DEFAULT_FIELD_MAX)
        if isinstance(v, str) and len(v) > limit:
            return k, len(v), limit
    return None


_MIN_LIMIT = {r.name: r.min_limit() for r in RULES}


def match_or_reject(line: Line) -> Match | Rejected | None:
    """The first rule that matches; WARN lines no rule explains become NCCLWarning; a line with a field
    past its bound (PREFIX_MAX, the rule's ``fields``) is Rejected whatever rule it would feed."""
    if line.over is not None:
        return Rejected(line, "prefix", *line.over)
    msg = line.msg
    for rule in RULES:
        if (rule.warn_only and line.level != "WARN") or (rule.nccl_only and not line.level):
            continue
        if rule.guard is not None and rule.guard.search(msg) is None:
            continue
        m = rule.pattern.search(msg)
        if m is None:
            continue
        fields = {k: v for k, v in m.groupdict().items() if v is not None}
        if rule.extract is not None:
            fields.update(rule.extract(msg, line.raw))
        if (fields and max(map(len, fields.values())) > _MIN_LIMIT[rule.name]
                and (over := _over(rule, fields)) is not None):
            return Rejected(line, rule.name, *over)
        if rule.convert is not None:
            rule.convert(fields)
        return Match(rule, line, fields)
    if line.level == "WARN":
        return Match(WARNING_RULE, line, {})
    return None


def match_line(line: Line) -> Match | None:
    """match_or_reject without the rejections (they are None here: count them with match_or_reject)."""
    m = match_or_reject(line)
    return m if isinstance(m, Match) else None


# Rules whose line may come wrapped over two lines (Rule.wrap): only they ask for a join.
_WRAPPING: tuple[Rule, ...] = tuple(r for r in RULES if r.wrap is not None)


def wraps(line: Line) -> bool:
    """Whether an unmatched line holds a part of a wrapping rule's line (only then is a join tried)."""
    return any(r.wrap is not None and r.wrap.search(line.raw) is not None for r in _WRAPPING)


def match_wrapped(data: bytes, start: int, end: int, max_line: int,
                  parse: Callable[[int, bytes], Line]) -> tuple[Match, int, int] | None:
    """A wrapped line found again: ``data[start:end]`` (a candidate no rule matched, holding a wrapping rule's
    part) joined with the line after it, then the previous line joined with it, exactly as a terminal breaks
    a long line (no character added). Bounded: one neighbour each side, the joined text at most ``max_line``
    bytes, two more matches at most; linear in the three lines' length. Only a wrapping rule's match counts
    (a join never feeds another rule). Returns the match (its line at the first part's place, ``parse``'s
    offset) and the span ``[first, last)`` of data it consumed, else None."""
    tries: list[tuple[int, int]] = []
    if end < len(data):  # the next line: what follows this one's newline
        nxt = data.find(b"\n", end + 1)
        tries.append((start, len(data) if nxt < 0 else nxt))
    if start > 0:  # the previous line
        tries.append((data.rfind(b"\n", 0, start - 1) + 1, end))
    for first, last in tries:
        if last - first > max_line:
            continue
        joined = data[first:last].replace(b"\r\n", b"").replace(b"\n", b"")
        m = match_or_reject(parse(first, joined))
        if isinstance(m, Match) and m.rule.wrap is not None:
            return m, first, last
    return None
