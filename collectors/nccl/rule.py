"""What a rule is: one NCCL or PyTorch line shape, everything about it in one place (rules/*.py).

A rule declares the byte needles one of which every line it matches contains (the prefilter and the
bench's grep pattern are built from them), its pattern (and an optional linear guard searched first),
the fields it yields with the longest value each can have when NCCL or PyTorch printed it, how it changes
the state of the process that wrote the line (``update``), and the message it emits (``say``): a message
type, a reason and the type's details. Severity and suggested action are never a rule's: they come from
gna_types.policy for (type, reason), so one table grades every finding.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collectors.nccl.process import ProcessState

Fields = dict[str, Any]


@dataclass(frozen=True)
class Said:
    """A rule's message: the plugin adds the writing process's summary and the line's place to
    ``details``, the severity and action from the policy table, and a reproducible id."""

    type: str
    reason: str
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Heard:
    """What the rule's ``say`` is told about the line besides its fields."""

    process: str  # "host:pid" of the writer
    msg: str  # the line's text after NCCL's prefix
    where: Mapping[str, Any]  # the process summary and the line's place (file, offset, line, ...)
    news: bool  # ``update`` said the line changed the process's state in a way worth a message


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    type: str  # the message type it emits or the condition its state feeds ("" for neither)
    fields: Mapping[str, int]  # every field it yields -> the longest value NCCL or PyTorch prints (bounds.py)
    needles: tuple[bytes, ...]
    warn_only: bool = False  # only on a WARN line
    nccl_only: bool = False  # only on a line with NCCL's own prefix (a bare printf of the same text is not)
    # searched first (linear): without it the rule cannot match, and with it the rule's first start that
    # gets past its head succeeds -- a lazy ".*?" tried from every repeat of the head is quadratic
    guard: re.Pattern[str] | None = None
    # more fields from the rest of the line (msg, raw), bounded like the pattern's
    extract: Callable[[str, str], Fields] | None = None
    # the fields made values (numbers, checked) once within their bounds
    convert: Callable[[Fields], None] | None = None
    # how the line changes its process's state; True: news worth a message (a communicator joined)
    update: Callable[[ProcessState, Fields], bool] | None = None
    say: Callable[[Fields, Heard], Said | None] | None = None
    news_only: bool = False  # says something only when its update brought news (not asked otherwise)
    hang: bool = False  # evidence that the job hangs here: the plugin asks RAS and the Flight Recorder
    repeats: bool = False  # the same text again within a window is counted into one summary
    # a part of the rule's line that a terminal or launcher may have wrapped onto two lines: a candidate line
    # holding it that no rule matches is joined with the line after it, then with the one before it, once each
    # (matching.match_wrapped: bounded, one wrap, never a chain)
    wrap: re.Pattern[str] | None = None
    # A line NCCL prints over and over (a channel line per connection, "Using network" per communicator):
    # ``repeat`` fullmatches the whole line as NCCL prints it, nothing before or after its prefix, with every
    # digit read as 0 (repeats.py matches a line's digit shape), its group ``who`` the writer's "host:pid" at the
    # line's start (line.INFO_SHAPE) and its group ``key`` the part of the line that decides every field
    # ``update`` reads. Each line it matches must decode to this rule, within every bound, whatever its digits,
    # and no rule before it may match one -- but for a literal digit in the key ("0x" stands for any digit
    # before an x): a key is counted only after its first line decoded to the rule, and the key's text is that
    # line's. The first line of a (who, key) is decoded; the same writer's later
    # ones in a chunk are counted, and ``tally(st, fields, n)`` leaves the state ``update`` would after n of them
    # (tests/test_nccl_repeats.py holds the two to the same state). ``update`` must return False for them (no
    # news: a repeat says nothing) and touch only state no other rule writes.
    repeat: re.Pattern[bytes] | None = None
    tally: Callable[[ProcessState, Fields, int], None] | None = None
    # the state it writes is its last line's ("Using network X" after "Using network Y"): counted lines are
    # applied only when one of them is the process's last line of the rule in the chunk (else order is free:
    # counts and sets only grow)
    last_wins: bool = False

    def min_limit(self) -> int:
        """The tightest bound among its fields: a line whose longest value is within it needs no
        field-by-field check (the hot path of a channel line)."""
        return min(self.fields.values(), default=1 << 30)

