"""HCA names as NCCL_IB_HCA selects them (src/transport/net_ib.cc, ncclIbInit: each entry a prefix unless the
value starts with ``=``; ``^`` excludes), and in natural order (mlx5_2 before mlx5_10)."""

from __future__ import annotations

import re
from typing import Any


def natural_key(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def hca_prefix_surprises(value: str, selected: list[str]) -> list[str]:
    """HCAs NCCL picked that an NCCL_IB_HCA value without '=' did not mean.

    ``mlx5_1`` is a prefix: it also selects mlx5_10..mlx5_19. ``=mlx5_1`` is exact; ``^`` excludes.
    """
    if not value or value.startswith(("=", "^")):
        return []
    wanted = [e.split(":")[0] for e in value.split(",") if e]
    return sorted({s for s in selected for w in wanted if s.startswith(w) and s != w and s not in wanted})


def exact_hca_value(value: str, present: list[str]) -> str:
    """The NCCL_IB_HCA value that selects exactly what ``value`` meant, for advice.

    NCCL matches each entry as a prefix unless the value starts with ``=``. An entry that names a
    present HCA means that HCA (``mlx5_1``, not mlx5_10..19); an entry that names none is a bare
    prefix (``mlx5``) and means what it selects now, listed one by one: ``=mlx5`` would select
    nothing at all. Ports (``:1``) are kept; ``=``/``^`` values are returned as they are.
    """
    if not value or value.startswith(("=", "^")):
        return value
    out: list[str] = []
    for entry in value.split(","):
        name, _, port = entry.strip().partition(":")
        if not name:
            continue
        names = [name] if name in present else sorted((h for h in present if h.startswith(name)), key=natural_key)
        for n in names or [name]:
            item = f"{n}:{port}" if port else n
            if item not in out:
                out.append(item)
    return "=" + ",".join(out)
