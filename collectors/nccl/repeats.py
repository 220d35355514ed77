"""Lines NCCL repeats, counted instead of decoded: the first of each kind per process is decoded, the rest counted.

A job start prints one channel line per connection (``Channel 02/0 : 3[3] -> 11[3] [send] via NET/IB/3/GDRDMA``,
src/transport/net.cc): hundreds per communicator and process, a third of NCCL's lines, alike but for the channel,
the ranks and the direction -- which no state reads; and per communicator the same ``Using network IB``, ``NET/IB :
Using ...`` and, set up again, ``... - Init COMPLETE``. A rule whose lines are such declares it (``Rule.repeat``,
``Rule.tally``, ``Rule.last_wins``: rules/channel_net.py, network.py, ib_using.py, init.py). Here, in one pass over
the prefilter's hits (prefilter.hits), a line of such a rule is read as its digit shape (every digit 0, one C
call); a shape the rule's ``repeat`` fullmatches (checked once per shape) is NCCL's own line, every field within
its bound, and names its writer (``who``, "host:pid") and the part that decides every field the rule's update
reads (``key``). The first line of a (who, key) is decoded as any line; the later ones of a writer of this node,
whose process is tracked and current, are counted by (who, key), and the plugin applies each count at once
(ProcessState.tally). A line that holds another needle too, is as long as ``max_line``, is in a container log, or
is of a writer that is not this node's is decoded as ever.

What changes state is never skipped: another transport, device, proxy or flag is another key, decoded when first
seen (a later ``via NET/Socket`` after IB, IB without GDRDMA after GDRDMA); a repeat adds only what its tally adds
(channel counts), or sets again what its rule sets when it is the process's last line of the rule in the chunk
(``Using network IB`` after ``Using network Socket``). Bounded: MAX_SHAPES shapes and MAX_KNOWN keys per rule
remembered; a process's keys go with it (``prune``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collectors.nccl.prefilter import KIND_BITS, REPEATING
from collectors.nccl.process import ProcessState
from collectors.nccl.rule import Fields

ZEROS = bytes.maketrans(b"123456789", b"000000000")
MAX_SHAPES = 4096
MAX_KNOWN = 1024  # per rule
_MASK = (1 << KIND_BITS) - 1
# a counted line is published nowhere: only a rule whose repeats say nothing may count them (no message but on news,
# which a repeat never brings; no hang, warning window or wrapped form)
for _rule in REPEATING:
    assert _rule.repeat is not None and _rule.tally is not None, _rule.name
    assert (_rule.say is None or _rule.news_only) and not (_rule.hang or _rule.repeats or _rule.wrap
                                                           or _rule.warn_only), _rule.name
_MISS: Any = object()


class Known:
    """A (who, key) whose first line was decoded: the fields the tally reads, the process, and the offsets of its
    lines counted in the chunk being read (reset when first met in a chunk, after checking it is still current)."""

    __slots__ = ("chunk", "counted", "fields", "rule", "st")

    def __init__(self, rule: int, fields: Fields, st: ProcessState) -> None:
        self.rule, self.fields, self.st = rule, fields, st
        self.chunk = -1
        self.counted: list[int] = []


@dataclass
class Split:
    """One chunk's candidate lines: those to decode (in order), and those counted."""

    candidates: list[tuple[int, bytes]]
    known: list[Known] = field(default_factory=list)  # met in this chunk: each with its counted offsets
    # the first line of a (who, key) not known before this chunk (decoded: among ``candidates``) ->
    # (rule index, key, the offsets of its later lines in this chunk, counted)
    firsts: dict[int, tuple[int, bytes, list[int]]] = field(default_factory=dict)

    def drop(self, spans: list[tuple[int, int]]) -> None:
        """Forget counted lines inside ``(after, before)`` spans: lines a wrapped line's join consumed."""
        def keep(offs: list[int]) -> list[int]:
            return [o for o in offs if not any(a < o < b for a, b in spans)]
        for k in self.known:
            k.counted = keep(k.counted)
        for off, (ri, key, offs) in list(self.firsts.items()):
            self.firsts[off] = (ri, key, keep(offs))


class Repeats:
    """The shapes checked and the (who, key)s known, across chunks and files (a process writes to several)."""

    def __init__(self) -> None:
        # digit shape -> (the rule's known (who, key)s, the rule's index in REPEATING, end of who, start of key)
        self.shapes: dict[bytes, tuple[dict[bytes, Known], int, int, int] | None] = {}
        self.known: list[dict[bytes, Known]] = [{} for _ in REPEATING]
        self.chunk = 0

    def _shape(self, shape: bytes) -> tuple[dict[bytes, Known], int, int, int] | None:
        if len(self.shapes) >= MAX_SHAPES:
            self.shapes.clear()
        got = None
        for i, rule in enumerate(REPEATING):
            m = rule.repeat.fullmatch(shape) if rule.repeat is not None else None
            if m is not None:
                got = (self.known[i], i, m.end("who"), m.start("key"))
                break
        self.shapes[shape] = got
        return got

    def remember(self, ri: int, key: bytes, fields: Fields, st: ProcessState) -> None:
        table = self.known[ri]
        if len(table) < MAX_KNOWN:
            k = table[key] = Known(ri, fields, st)
            k.chunk = self.chunk  # its counted lines of this chunk are the first's, tallied apart

    def prune(self, current: Callable[[ProcessState], bool]) -> None:
        """Forget the keys of processes no longer tracked (collect(): ended, quiet, their log gone)."""
        for table in self.known:
            for key in [key for key, k in table.items() if not current(k.st)]:
                del table[key]

    def split(self, data: bytes, base: int, hits: list[int], max_line: int, local: Callable[[bytes], bool],
              current: Callable[[ProcessState], bool]) -> Split:
        """The chunk's candidate lines from the prefilter's ``hits``: each line once, in order, either to decode
        or counted. ``local(who)``: the writer is this node's (its lines judged here); ``current(st)``: the
        process is still the one tracked."""
        self.chunk += 1
        chunk = self.chunk
        out = Split([])
        cands = out.candidates
        add = cands.append
        used = out.known
        firsts = out.firsts
        fresh: list[dict[bytes, list[int] | None]] = [{} for _ in REPEATING]
        rfind, find, size = data.rfind, data.find, len(data)
        shapes = self.shapes
        checked: dict[int, bool] = {}  # id(process state) -> still current and this node's, in this chunk
        last = -1
        held: list[int] | None = None  # where the previous line was counted (taken back if it holds two needles)
        line = b""
        for code in hits:
            to = code >> KIND_BITS
            start = rfind(b"\n", 0, to - 1) + 1  # the match's last byte may be the newline
            if start == last:
                if held is not None:  # another needle on a counted line: decoded after all
                    held.pop()
                    add((base + start, line))
                    held = None
                continue
            last = start
            held = None
            end = find(b"\n", to - 1)
            if end < 0:
                end = size
            if code & _MASK and end - start < max_line:
                line = data[start:end]
                shape = line.translate(ZEROS)
                got = shapes.get(shape, _MISS)
                if got is _MISS:
                    got = self._shape(shape)
                if got is not None:
                    table, ri, x, y = got
                    key = line[:x] + line[y:]
                    k = table.get(key)
                    if k is not None:
                        if k.chunk != chunk:  # first met in this chunk: its process still current, this node's?
                            ok = checked.get(id(k.st))
                            if ok is None:
                                ok = checked[id(k.st)] = current(k.st) and local(line[:x])
                            if ok:
                                k.chunk, k.counted = chunk, []
                                used.append(k)
                            else:
                                del table[key]
                                k = None
                        if k is not None:
                            held = k.counted
                            held.append(base + start)
                            continue
                    pend = fresh[ri].get(key, _MISS)
                    if pend is _MISS:
                        pend = fresh[ri][key] = [] if local(line[:x]) else None
                        if pend is not None:
                            firsts[base + start] = (ri, key, pend)
                    elif pend is not None:
                        held = pend
                        held.append(base + start)
                        continue
                    add((base + start, line))
                    continue
            add((base + start, data[start : min(end, start + max_line)]))
        return out
