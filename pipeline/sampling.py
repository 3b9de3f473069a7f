"""Deterministic sampling: an event is in or out by a hash of its `request_id` alone.

The same event gets the same decision on every runner, in every order and after every restart,
so a replayed partition never samples differently and counts stay exactly-once.
"""

from __future__ import annotations

import hashlib

_SCALE = float(2**64)


def sample_point(request_id: str) -> float:
    """A stable number in [0, 1) derived from the request id (BLAKE2b, 64 bits)."""
    digest = hashlib.blake2b(request_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


def is_sampled(request_id: str, rate: float) -> bool:
    """True when the event belongs to the sample at `rate` (0 keeps none, 1 keeps all)."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"sample rate must be within [0, 1], got {rate}")
    return sample_point(request_id) < rate
