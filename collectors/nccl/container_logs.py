"""Container logs as the kubelet's runtime writes them: records to lines, and the pod a file belongs to.

A training process's stderr (PyTorch's watchdog, and NCCL's lines when NCCL_DEBUG_FILE is unset) reaches a
Kubernetes node's disk as ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log`` (kubelet,
pkg/kubelet/kuberuntime/helpers.go BuildPodLogsDirectory / BuildContainerLogsDirectory; namespace and pod
names are DNS-1123 labels and subdomains, without ``_``), in one of two record formats the kubelet itself
reads back (kubernetes/kubernetes pkg/kubelet/kuberuntime/logs/logs.go, v1.31: parseCRILog, parseDockerJSONLog):

- CRI (containerd, CRI-O): ``<RFC 3339 nano time> <stdout|stderr> <tags> <content>\\n``; the first of the
  ``:``-separated tags is ``P`` for a partial line, continued by the stream's next record, or ``F`` for the
  one that ends it. Runtimes cut a line into ``P`` records past their buffer (containerd's
  max_container_log_line_size, 16 KiB by default).
- Docker's json-file (dockershim, cri-dockerd): ``{"log":"<content>","stream":"stderr","time":"..."}``; a
  ``log`` that does not end in a newline is partial, continued likewise.

``lines()`` turns a chunk of such a file into logical lines: the records that carry a prefilter needle (the
byte scan runs over the raw records, in C), partial records joined per stream first, each line's content
without the runtime's header and with the runtime's time. A partial run not finished by the end of the
chunk is left unread (``Lines.unfinished``): the tailer reads it again when the file grows. A run longer
than ``max_join`` is ended there and counted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Format = Literal["cri", "docker", "plain"]

# <time> <stream> <tags> : the kubelet parses the time as RFC 3339 with nanoseconds and any zone
_CRI = re.compile(rb"(?P<time>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2})) "
                  rb"(?P<stream>stdout|stderr) (?P<tag>[^ \n]{1,64}) ")
# literal-led (a "^" in multi-line mode is tried at every byte: 10x slower on a chatty pod's log)
_CRI_PARTIAL = re.compile(rb" (?:stdout|stderr) P[ :]")
# json-file: moby daemon/logger/jsonfilelog/jsonlog JSONLogs.MarshalJSONBuf: "log", "stream", optional "attrs",
# "time" in this order; the log escapes '"', '\\', control bytes and also '<', '>', '&' (as \\u00XX)
_DOCKER = re.compile(rb'\{"log":"(?P<log>(?:[^"\\\n]|\\.)*)","stream":"(?P<stream>stdout|stderr)"'
                     rb'(?:,"attrs":\{[^\n]*?\})?,"time":"(?P<time>[^"\n]{1,40})"')
_DOCKER_PARTIAL = re.compile(rb'(?<!\\n)","stream":"(?:stdout|stderr)"')
_DOCKER_FULL = b'\\n","stream":"'  # a record whose log ends in its newline
# /var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log[.<rotation time>]
_POD_PATH = re.compile(r"/var/log/pods/(?P<ns>[a-z0-9][a-z0-9-]{0,62})_(?P<pod>[a-z0-9][a-z0-9.-]{0,252})_"
                       r"(?P<uid>[0-9a-f-]{1,64})/(?P<container>[a-z0-9][a-z0-9-]{0,62})/(?P<n>\d{1,9})\.log")


@dataclass(frozen=True)
class PodRef:
    namespace: str
    pod: str
    uid: str
    container: str


def pod_of_path(path: str) -> PodRef | None:
    """The pod a container log belongs to, from its path (no API asked); None for any other file."""
    m = _POD_PATH.search(path)
    return PodRef(m["ns"], m["pod"], m["uid"], m["container"]) if m else None


def sniff(first: bytes) -> Format:
    """A container log's record format from its first line (the kubelet probes the same way)."""
    if _CRI.match(first):
        return "cri"
    if _DOCKER.match(first):
        return "docker"
    return "plain"


@dataclass
class Lines:
    lines: list[tuple[int, bytes, str]] = field(default_factory=list)  # (offset, content, runtime time)
    unfinished: int = 0  # bytes at the chunk's end left for the next read (a partial run not ended yet)
    joined: int = 0  # partial runs joined into one line
    cut: int = 0  # runs ended at max_join
    bad: int = 0  # candidate records that are not in the file's format (shown as they are)


def _record(fmt: Format, raw: bytes) -> tuple[str, bool, bytes, str] | None:
    """(stream, partial, content, time) of one record; None when it is not one."""
    if fmt == "cri":
        m = _CRI.match(raw)
        if m is None:
            return None
        return m["stream"].decode(), m["tag"].split(b":", 1)[0] == b"P", raw[m.end():], m["time"].decode()
    m = _DOCKER.match(raw)
    if m is None:
        return None
    try:
        text = json.loads(b'"' + m["log"] + b'"')
    except ValueError:
        return None
    partial = not text.endswith("\n")
    return m["stream"].decode(), partial, text.rstrip("\n").encode("utf-8", "surrogateescape"), m["time"].decode()


def _partial_starts(fmt: Format, data: bytes) -> list[int]:
    """Where each partial record of the chunk starts (a C-speed scan; none on most chunks)."""
    if fmt == "docker":
        if data.count(b"\n") == data.count(_DOCKER_FULL):
            return []  # every record ends its line
        found = _DOCKER_PARTIAL.finditer(data)
    else:
        found = _CRI_PARTIAL.finditer(data)
    starts: list[int] = []
    for m in found:
        start = data.rfind(b"\n", 0, m.start()) + 1
        if not starts or starts[-1] != start:
            starts.append(start)
    return starts


def lines(fmt: Format, data: bytes, base: int, candidates: list[tuple[int, bytes]], *, final: bool, full: bool,
          keep: Callable[[bytes], bool], max_join: int = 1 << 20) -> Lines:
    """The logical lines of a chunk of a container log that hold a needle.

    ``candidates`` are the prefilter's (offset, record) over the raw chunk (starting at ``base``); a joined
    run is kept when ``keep`` (the prefilter) accepts its content. ``final``: no more data will come
    (``check`` at the end of the file): an unfinished run is joined as it is. ``full``: the chunk is as long as
    a read gets: a run that starts the chunk and is not finished in it is cut there (counted), since waiting
    would read the same chunk again.
    """
    out = Lines()
    in_runs: set[int] = set()  # offsets of records that belong to a partial run (joined, not read alone)
    for start in _partial_starts(fmt, data):
        if base + start in in_runs:
            continue
        nl = data.find(b"\n", start)
        first = _record(fmt, data[start:len(data) if nl < 0 else nl])
        if first is None or not first[1]:
            continue  # the text " stdout P " inside a whole record's content
        stream, time_ = first[0], first[3]
        parts: list[bytes] = []
        pos, size, ended = start, 0, False
        members: list[int] = []
        while pos < len(data):
            nl = data.find(b"\n", pos)
            end = len(data) if nl < 0 else nl
            rec = _record(fmt, data[pos:end])
            if rec is not None and rec[0] == stream:  # the other stream's records are lines of their own
                members.append(base + pos)
                parts.append(rec[2])
                size += len(rec[2])
                if not rec[1]:
                    ended = True
                    break
                if size >= max_join:
                    out.cut += 1
                    ended = True
                    break
            pos = end + 1
        if not ended and not final:
            if start > 0 or not full:
                out.unfinished = len(data) - start  # read again, from the run's first record, when it grows
                break
            out.cut += 1
        in_runs.update(members)
        out.joined += 1
        joined = b"".join(parts)
        if keep(joined):
            out.lines.append((base + start, joined, time_))
    cut_at = base + len(data) - out.unfinished
    for offset, raw in candidates:
        if offset in in_runs or offset >= cut_at:
            continue
        rec = _record(fmt, raw)
        if rec is None:
            out.bad += 1
            out.lines.append((offset, raw, ""))
            continue
        out.lines.append((offset, rec[2], rec[3]))
    out.lines.sort(key=lambda t: t[0])
    return out
