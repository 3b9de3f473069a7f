"""Shared pytest settings."""

import logging
from pathlib import Path

import pytest

# The session's Apache Kafka broker (one per pytest-xdist worker) and the per-test view of it.
from kafka_broker import apache_kafka, kafka_broker  # noqa: F401

# `ragpulse serve` subprocesses for any test module: `serve_processes`, and `served_topic` on the
# module's `broker` fixture (see tests/serve_process.py).
from serve_process import serve_processes_fixture, served_topic_fixture  # noqa: F401

import ragpulse

# kafka-python's background threads log after pytest has closed the captured streams of a
# finished test; without this every such line prints a "--- Logging error ---" traceback.
logging.raiseExceptions = False

# The tests test this checkout: an editable install of another checkout (a second worktree
# sharing a virtualenv) would hand them its ragpulse instead, and every test would pass or fail
# on code nobody is looking at.
_CHECKOUT = Path(__file__).resolve().parents[1]
if Path(ragpulse.__file__).resolve().parent != _CHECKOUT / "ragpulse":
    raise pytest.UsageError(
        f"ragpulse is imported from {Path(ragpulse.__file__).parent}, not from this checkout "
        f"({_CHECKOUT}): install it from here (make installs it into .venv), or run pytest "
        f"from {_CHECKOUT}"
    )


# Tests that start a Kafka broker or a `ragpulse serve` process take seconds each: they are slow
# wherever they are written, so new ones are left out of `make test-fast` without a decorator.
# Those that need a Kafka broker (Apache Kafka, or Tansu where it stays) are marked `kafka` too,
# so `pytest -m kafka` runs exactly them.
_KAFKA_FIXTURES = frozenset({
    "apache_kafka", "kafka_broker", "broker", "outage_broker", "serve_processes", "served_topic",
    "tls_kafka", "sasl_kafka", "secure_broker",
})
_SLOW_FIXTURES = _KAFKA_FIXTURES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if _SLOW_FIXTURES & used:
            item.add_marker(pytest.mark.slow)
        if _KAFKA_FIXTURES & used:
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(autouse=True)
def _fresh_verdict_caches() -> None:
    # The verdict cache is process-wide by design (it spans serve cycles); a test that judges
    # the same sample events as an earlier one must not find their verdicts cached.
    from ragpulse.judges.verdict_cache import forget_shared_verdict_caches

    forget_shared_verdict_caches()
