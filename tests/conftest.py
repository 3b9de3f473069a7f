"""Shared pytest settings."""

import logging
import os
import subprocess
import tempfile
from collections.abc import Iterator
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


# The longest modules of `make test` (run 39b's --durations), handed out first: with
# `--dist loadscope` a worker takes the next module once it has two tests or fewer left, and
# xdist's own order (most tests first) left the one-test Flink modules to the end, queued on one
# worker while the other idled for 4 min (run 39b). Longest first, the short modules fill in
# around them. The order is the only effect: every module still runs, alone on its worker.
_LONGEST_MODULES_FIRST = (
    "test_end_to_end_alerts.py",
    "test_stream_flink_cluster.py",
    "test_serve_kill_loop.py",
    "test_stream_flink_live.py",
    "test_serve_instances.py",
    "test_serve.py",
    "test_stream_flink.py",
    "test_stream_flink_labels.py",
    "test_image.py",
)


def _start_rank(item: pytest.Item) -> int:
    name = item.path.name
    if name in _LONGEST_MODULES_FIRST:
        return _LONGEST_MODULES_FIRST.index(name)
    return len(_LONGEST_MODULES_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)  # stable: the rest keep their collection order
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if _SLOW_FIXTURES & used:
            item.add_marker(pytest.mark.slow)
        if _KAFKA_FIXTURES & used:
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_under_pytests_temp_folder(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """Temporary files of the session go under pytest's own temp folder (kept for the last
    three runs, then removed by pytest), not /tmp: Beam's beam-pipeline-temp* and
    beam-artifact-staging folders, the logs of serve processes and whatever a subprocess makes
    with its tempfile module (it inherits TMPDIR). Before, every run left them in /tmp."""
    folder = tmp_path_factory.mktemp("tmpdir")
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # tempfile reads TMPDIR again
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        tempfile.tempdir = None


@pytest.fixture(autouse=True)
def _fresh_verdict_caches() -> None:
    # The verdict cache is process-wide by design (it spans serve cycles); a test that judges
    # the same sample events as an earlier one must not find their verdicts cached.
    from ragpulse.judges.verdict_cache import forget_shared_verdict_caches

    forget_shared_verdict_caches()


# Tests write only under tmp_path: a file a test leaves in the checkout (a state file written to
# the working directory, as ragpulse-state.sqlite once was and got committed) fails the run. The
# checkout's `git status` is compared before and after the session, by the one process that sees
# the whole session (pytest-xdist's controller, or pytest itself without workers). Caches that
# tools keep beside the code are left out.
_CACHES = frozenset({
    ".venv", ".cache", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis",
})
_STATUS_BEFORE = pytest.StashKey[set[str] | None]()


def _checkout_status() -> set[str] | None:
    """The checkout's untracked and ignored paths, caches left out (None: no git)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(_CHECKOUT), "status", "--porcelain", "--ignored",
             "--untracked-files=all", "-z"],
            capture_output=True, check=False, timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None  # not a git checkout (an unpacked sdist): nothing to compare
    entries = done.stdout.decode("utf-8", "replace").split("\0")
    return {
        entry for entry in entries
        if entry[:3] in ("?? ", "!! ")  # new files; edits to tracked ones may be the developer's
        and not _CACHES & set(Path(entry[3:]).parts)
        and not any(part.endswith(".egg-info") for part in Path(entry[3:]).parts)
    }


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _is_xdist_worker(session.config):
        session.config.stash[_STATUS_BEFORE] = _checkout_status()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _is_xdist_worker(session.config):
        return
    before = session.config.stash.get(_STATUS_BEFORE, None)
    after = _checkout_status()
    if before is None or after is None:
        return
    left = sorted(after - before)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (
            f"the tests left {len(left)} file(s) in the checkout {_CHECKOUT} (tests write only "
            "under tmp_path): " + ", ".join(entry[3:] for entry in left)
        )
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

