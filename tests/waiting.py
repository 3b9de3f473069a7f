"""Waiting for a condition that another process brings about (a Flink job's state, a pane on a
topic), polled at a fixed pace, failing with what did not happen and the logs that say why."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    check: Callable[[], Any], what: str, timeout: float = 300.0,
    logs: Callable[[], str] | None = None, every_s: float = 0.3,
) -> Any:
    """Polls `check()` every `every_s` until it returns something truthy and returns that;
    fails saying `what` did not happen within `timeout` seconds, with `logs()` after it.
    Typed Any: a check returns its value or a falsy one, and no return type removes those."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every_s)
    detail = logs() if logs else ""
    raise AssertionError(f"{what} did not happen within {timeout}s\n{detail}")
