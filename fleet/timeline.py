"""The node page's timeline: each condition's firing spans as one SVG, zoomed to the data.

Rendered here rather than in the browser so it is one request and stays well-formed whatever the
labels hold. The range runs from a little before the earliest span to now (at least
``MIN_RANGE_S``, at most the caller's window): a port that flapped for ten seconds fills the
plot instead of being a 1-px tick on a 6-hour axis. Each span is coloured by its severity (critical
red, warning amber, info grey; a legend under the plot says which) and its title names it; times are
fleet/text.py ``stamp`` (UTC), as everywhere in the dashboard.

A span starts when the node read what began it, or -- where the span carries one -- at the time its source
stated (a log line's own stamp, ``logged_at``: a job's log read minutes late, or after an agent restart,
still puts the fault where it happened). Each row's spans are drawn in the order of those starts, and the
title says which time the start is.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleet.text import stamp

MIN_RANGE_S = 60.0
STEPS_S = (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600)
TICK_MIN_PX = 70  # room for a label like "-1h30m" between ticks
FONT_PX = 11
# Labels are monospace so their width is known without a browser: DejaVu/Liberation Mono advance
# 0.60 em; a little more so a fallback font still fits the gutter.
CHAR_PX = 0.62 * FONT_PX
LINE_PX = 13
LABEL_X = 4
GAP = 10  # between the gutter and the plot, and after the plot
AXIS_Y = 16
MIN_SPAN_PX = 3.0
MAX_GUTTER_SHARE = 0.35  # longer labels wrap instead of squeezing the plot
LEGEND_H = 18
# A span's fill by its severity: a warning must not look critical. The dashboard's other colours agree
# (fleet/static: .critical red, .warning amber); info, or no severity, is neutral.
SEVERITY_FILL = {"critical": "#c0392b", "warning": "#e0a020", "info": "#8c9aa6"}
NEUTRAL_FILL = "#8c9aa6"
LEGEND = ("critical", "warning", "info")


@dataclass
class Row:
    label: str  # "Type entity"
    # [start, end or None while firing, severity, stated start or absent/None], epochs: ``start`` when the
    # node read it; the stated start (epoch seconds or RFC 3339) when its source logged it
    spans: Sequence[Sequence[Any]]


def _severity(span: Sequence[Any]) -> str:
    sev = span[2] if len(span) > 2 else ""
    return sev if sev in SEVERITY_FILL else ""


def _stated(span: Sequence[Any]) -> float | None:
    """A span's stated start as epoch seconds: a finite number, or an RFC 3339 time; None for anything else."""
    v = span[3] if len(span) > 3 else None
    if isinstance(v, str) and 0 < len(v) <= 64:
        try:
            t = dt.datetime.fromisoformat(v.strip())
        except ValueError:
            return None
        return (t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)).timestamp()
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _start(span: Sequence[Any]) -> tuple[float, bool]:
    """(where the span starts, whether that is its stated time): the stated start where it has one (never
    after its end), else when the node read it."""
    stated = _stated(span)
    if stated is None:
        return float(span[0] or 0), False
    return (stated if span[1] is None else min(stated, float(span[1]))), True


def render(rows: Sequence[Row], *, now: float, max_s: float, width: int) -> str:
    visible = [(r, sorted(((*_start(sp), sp[1], _severity(sp)) for sp in r.spans
                           if sp[1] is None or float(sp[1]) >= now - max_s), key=lambda x: x[0])) for r in rows]
    visible = [(r, spans) for r, spans in visible if spans]
    starts = [max(s, now - max_s) for _, spans in visible for s, _st, _e, _sev in spans]
    gutter = _gutter([r.label for r, _ in visible], width)
    right = width - GAP
    plot = right - gutter
    want = max(MIN_RANGE_S, (now - min(starts)) * 1.1) if starts else max_s  # 10 % room before the first
    step = _step(min(want, max_s), plot)
    range_s = min(max_s, math.ceil(want / step) * step)  # whole steps: a tick at both ends of the axis
    start = now - range_s

    def x_of(t: float) -> float:
        return gutter + (min(max(t, start), now) - start) / range_s * plot

    max_chars = max(8, int((gutter - LABEL_X - GAP / 2) / CHAR_PX))
    layout, y = [], AXIS_Y + 6
    for r, spans in visible:
        lines = _wrap(r.label, max_chars)
        h = max(18, len(lines) * LINE_PX + 6)
        layout.append((r, spans, lines, y, h))
        y += h
    legend_y = max(y, AXIS_Y + 30) + 4
    height = legend_y + (LEGEND_H if visible else 0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" '
           f'font-size="{FONT_PX}" data-range-s="{range_s:g}" data-gutter="{gutter}" data-plot-right="{right}" '
           f'data-now="{now:.3f}">', f'<rect width="{width}" height="{height}" fill="#fff"/>']
    k = 0
    while now - k * step >= start - 1e-6:
        x = x_of(now - k * step)
        anchor = "end" if k == 0 else "middle"
        out.append(f'<line class="tick" x1="{x:.1f}" y1="{AXIS_Y}" x2="{x:.1f}" y2="{height}" stroke="#eee"/>'
                   f'<text class="tick" x="{x:.1f}" y="{AXIS_Y - 4}" text-anchor="{anchor}" fill="#777">'
                   f'{_ago(k * step)}</text>')
        k += 1
    out.append(f'<line class="axis" x1="{gutter}" y1="{AXIS_Y}" x2="{right}" y2="{AXIS_Y}" stroke="#999"/>')
    for r, spans, lines, y, h in layout:
        out.append(f'<line x1="0" y1="{y + h}" x2="{width}" y2="{y + h}" stroke="#f3f3f3"/>')
        tspans = "".join(f'<tspan x="{LABEL_X}" dy="{0 if i == 0 else LINE_PX}">{_esc(line)}</tspan>'
                         for i, line in enumerate(lines))
        out.append(f'<g><title>{_esc(r.label)}</title><text class="label" x="{LABEL_X}" y="{y + 13}" '
                   f'font-family="monospace" fill="#333">{tspans}</text></g>')
        for s, stated, e, sev in spans:
            end = now if e is None else min(float(e), now)
            x0, x1 = x_of(s), x_of(end)
            w = max(MIN_SPAN_PX, x1 - x0)
            x0 = min(x0, right - w)  # a span that just began still shows, left of the edge
            until = "still firing" if e is None else f"to {stamp(float(e))}"
            dur = _dur(end - s)
            out.append(f'<rect class="span" x="{x0:.1f}" y="{y + 3}" width="{w:.1f}" height="{h - 6}" '
                       f'fill="{SEVERITY_FILL.get(sev, NEUTRAL_FILL)}" rx="2" data-severity="{sev}" '
                       f'data-start="{s:.3f}" data-start-is="{"logged" if stated else "read"}" '
                       f'data-end="{"" if e is None else f"{e:.3f}"}" data-dur="{dur}">'
                       f'<title>{_esc(r.label)}&#10;{sev or "no severity"} from {stamp(s)} {until} ({dur}); '
                       f'start: {"the time its source logged" if stated else "when the node read it"}</title>'
                       f'</rect>')
    if visible:
        out.append(_legend(legend_y))
    else:
        out.append(f'<text x="{LABEL_X}" y="{AXIS_Y + 20}" fill="#888">no condition fired in the last '
                   f'{_dur(max_s)}</text>')
    out.append("</svg>")
    return "".join(out)


def _legend(y: int) -> str:
    """What the colours mean, under the plot: a swatch and the severity's name for each."""
    parts, x = ['<g class="legend">'], LABEL_X
    for sev in LEGEND:
        parts.append(f'<rect class="swatch" x="{x}" y="{y + 4}" width="10" height="10" rx="2" '
                     f'fill="{SEVERITY_FILL[sev]}" data-severity="{sev}"/>'
                     f'<text x="{x + 14}" y="{y + 13}" fill="#555">{sev}</text>')
        x += 14 + math.ceil(len(sev) * CHAR_PX) + 14
    parts.append("</g>")
    return "".join(parts)


def _gutter(labels: list[str], width: int) -> int:
    longest = max((len(s) for s in labels), default=0)
    want = math.ceil(longest * CHAR_PX) + LABEL_X + GAP
    return max(120, min(want, int(width * MAX_GUTTER_SHARE)))


def _step(range_s: float, plot_px: float) -> int:
    most = max(2, int(plot_px // TICK_MIN_PX))
    return next((s for s in STEPS_S if range_s / s <= most), STEPS_S[-1])


def _wrap(label: str, max_chars: int) -> list[str]:
    """Lines of at most max_chars, broken after a space, '/' or ':' where one is near: joined they
    are the label again, so nothing is cut."""
    lines, rest = [], label
    while len(rest) > max_chars:
        cut = max(rest.rfind(c, 1, max_chars) for c in " /:") + 1
        if cut < max_chars // 3:
            cut = max_chars
        lines.append(rest[:cut])
        rest = rest[cut:]
    return [*lines, rest]


def _ago(seconds: float) -> str:
    s = round(seconds)
    if not s:
        return "now"
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return "-" + (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{sec}s" if sec else "")


def _dur(seconds: float) -> str:
    if seconds < 10:
        return f"{max(0.0, seconds):.1f} s"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if not h:
        return f"{m} min {sec} s" if sec else f"{m} min"
    return f"{h} h {m} min" if m else f"{h} h"


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
