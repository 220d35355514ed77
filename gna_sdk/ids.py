"""Time-sortable unique ids (ULID: 48-bit ms timestamp + 80 random bits, Crockford base32).

Monotonic within one process: ids made in the same millisecond increment the random part,
so lexical order equals creation order — the id doubles as the NATS ``Nats-Msg-Id``.
"""

from __future__ import annotations

import os
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_lock = threading.Lock()
_last_ms = -1
_last_rand = 0


def _encode(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_id(now_ms: int | None = None) -> str:
    global _last_ms, _last_rand
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    with _lock:
        if ms <= _last_ms:
            ms = _last_ms
            _last_rand = (_last_rand + 1) & ((1 << 80) - 1)
        else:
            _last_ms = ms
            _last_rand = int.from_bytes(os.urandom(10), "big") >> 1  # headroom for increments
        rand = _last_rand
    return _encode(ms, 10) + _encode(rand, 16)


def id_time_ms(ulid: str) -> int:
    value = 0
    for ch in ulid[:10]:
        value = value * 32 + _ALPHABET.index(ch)
    return value


def derived_id(ms: int, seq: int, *parts: object) -> str:
    """A reproducible ULID: ``ms`` and ``seq`` (order within a batch) up front, then a hash of
    ``parts``. Re-processing the same input after a crash yields the same id, so the NATS
    duplicate window drops the re-send; a different message never collides with it."""
    import hashlib

    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    rand = ((seq & 0xFFFF) << 64) | int.from_bytes(digest, "big")
    return _encode(ms, 10) + _encode(rand, 16)
