"""Shared pytest settings."""

import logging

import pytest

# `ragpulse serve` subprocesses for any test module: `serve_processes`, and `served_topic` on the
# module's `broker` fixture (see tests/serve_process.py).
from serve_process import serve_processes_fixture, served_topic_fixture  # noqa: F401

# kafka-python's background threads log after pytest has closed the captured streams of a
# finished test; without this every such line prints a "--- Logging error ---" traceback.
logging.raiseExceptions = False


# Tests that start a Kafka broker or a `ragpulse serve` process take seconds each: they are slow
# wherever they are written, so new ones are left out of `make test-fast` without a decorator.
_SLOW_FIXTURES = frozenset({"kafka_broker", "broker", "outage_broker", "serve_processes"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _fresh_verdict_caches() -> None:
    # The verdict cache is process-wide by design (it spans serve cycles); a test that judges
    # the same sample events as an earlier one must not find their verdicts cached.
    from judges.verdict_cache import forget_shared_verdict_caches

    forget_shared_verdict_caches()
