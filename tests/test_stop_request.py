"""serve's stop request is safe to set from a signal handler at any moment."""

import signal
import threading
import time
from types import FrameType

from ragpulse.pipeline.service.loop import StopRequest


def test_sleep_returns_within_a_poll_interval_of_a_request_from_another_thread() -> None:
    stop = StopRequest()
    threading.Timer(0.2, stop.request, args=("test",)).start()
    started = time.monotonic()
    stop.sleep(30)
    assert time.monotonic() - started < 0.2 + 2 * StopRequest.POLL_SECONDS
    assert stop.requested and stop.why == "test"


def test_signals_hammering_the_sleeping_loop_never_block_it() -> None:
    # A repeating 1 ms timer signal interrupts sleep() thousands of times at every bytecode
    # position; a handler that took a lock (threading.Event.set) could deadlock here.
    stop = StopRequest()
    fired = 0

    def handler(signum: int, _frame: FrameType | None) -> None:
        nonlocal fired
        fired += 1
        if fired == 500:
            stop.request(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
    try:
        started = time.monotonic()
        while not stop.requested and time.monotonic() - started < 20:
            stop.sleep(0.05)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert stop.requested and stop.why == "SIGALRM"
    assert fired >= 500
