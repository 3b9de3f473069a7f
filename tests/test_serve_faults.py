"""Faults that could lose data quietly, injected into a real `ragpulse serve` and Tansu broker.

A state file that cannot be used; a topic recreated behind the saved offsets; records far over
the size limit; a dead-letter topic that refuses records, or fails for a while. Each test checks
what an operator sees (exit code, log, /metrics) and that every record is accounted for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli import one_line_error, ragpulse
from serve_process import (
    T0,
    ServedTopic,
    ServeProcess,
    TopicFactory,
    caught_up,
    read_topic,
    saved_offsets,
)
from tansu_broker import TansuBroker
from test_state import bad_state_file_fixture  # noqa: F401

from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.sources.kafka import log_bounds

# Each test waits up to a minute or two for serve to read, fail or recover.
pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def schema_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the broker finds topic schemas (`TOPIC.json`); tests add and change them."""
    return tmp_path_factory.mktemp("tansu") / "schemas"


@pytest.fixture(scope="module")
def broker(schema_dir: Path) -> Iterator[TansuBroker]:
    schema_dir.mkdir()
    with TansuBroker(schema_dir=schema_dir) as shared:
        yield shared


def events(seed: int, count: int, start: float = T0) -> list[bytes]:
    return [e.payload for e in simulate(seed, count, start, rate=10)]


# --- state files that cannot be used ---------------------------------------------------------


@pytest.mark.slow
def test_serve_and_windows_stop_with_one_line_and_exit_code_2_on_a_bad_state_file(
    bad_state_file: tuple[Path, str],
) -> None:
    state, why = bad_state_file
    for command in (
        # Nothing listens on port 1: the state file must be refused before Kafka is asked.
        ["serve", "--kafka-bootstrap", "127.0.0.1:1", "--topic", "t", "--metrics-port", "0"],
        ["windows"],
    ):
        done = ragpulse(*command, "--state", str(state))
        # Settings are checked first and log at INFO (e.g. the judge backend chosen); the state
        # file's error must be the only other line.
        line = one_line_error(done.returncode, done.stderr, allow_info=True)
        assert line.startswith(f"ragpulse {command[0]}: state file {state}")
        assert why in line and "--state-reset" in line


def test_state_reset_moves_a_bad_file_aside_and_goes_on_from_the_group_offsets(
    served_topic: TopicFactory,
) -> None:
    topic = served_topic("state-reset", records=events(21, 100))
    serve = topic.serve()
    serve.wait_for(caught_up(100), 60, "the first 100 records")
    assert serve.terminate() == 0  # its cycles committed offset 100 to the consumer group

    topic.state.write_bytes(b"")  # e.g. a disk that filled up while the file was rewritten
    topic.produce(events(22, 40, T0 + 10))
    serve = topic.serve("--state-reset")
    m = serve.wait_for(caught_up(40), 60, "the 40 records after the group offset")
    m = serve.wait_for(
        lambda s: s.total("ragpulse_cycles_total", outcome="ok") >= 3, 30, "two more cycles"
    )
    # A fresh state, going on where the consumer group was: the first 100 are not re-read.
    assert m.value("ragpulse_events_total", outcome="accepted") == 40
    assert saved_offsets(topic.state, topic.name) == {0: 140}
    moved = list(topic.state.parent.glob("state.sqlite.corrupt-*"))
    assert len(moved) == 1 and moved[0].read_bytes() == b""
    assert "moved it to" in serve.log_text()
    assert serve.terminate() == 0


# --- a topic recreated behind the saved offsets ------------------------------------------------


def _recreated_behind_serve(
    served_topic: TopicFactory, name: str, seed: int, on_offset_reset: str | None = None
) -> tuple[ServedTopic, ServeProcess]:
    """Serve (with --on-offset-reset ON_OFFSET_RESET if given) has read the topic's 100
    records; then the topic is recreated holding 30 new ones. Returns the topic and serve."""
    topic = served_topic(name, records=events(seed, 100))
    serve = topic.serve(*(["--on-offset-reset", on_offset_reset] if on_offset_reset else []))
    serve.wait_for(caught_up(100), 60, "the first 100 records")
    with serve.paused():
        topic.broker.delete_topic(topic.name)
        topic.broker.create_topic(topic.name, 1)
        fresh = events(32, 30, T0 + 10)
        topic.produce(fresh)
        # Tansu may still serve the old log for a moment after the topic is recreated (seen in
        # a fresh-clone run: serve's first look found it 99 records long, reset there, then
        # again at 30): serve goes on only once the broker serves the new one alone.
        _wait_until_the_topic_holds(topic, fresh)
    return topic, serve


def _wait_until_the_topic_holds(topic: ServedTopic, values: list[bytes]) -> None:
    deadline = time.monotonic() + 120  # a hang guard
    bootstrap = topic.broker.bootstrap
    while True:
        held = [r.value for r in read_topic(bootstrap, topic.name, len(values))]
        bounds = log_bounds(bootstrap, topic.name)  # what serve asks the broker
        if held == values and bounds.ends == {0: len(values)} and bounds.beginnings == {0: 0}:
            return
        assert time.monotonic() < deadline, f"{topic.name}: {len(held)} records, {bounds}"
        time.sleep(0.2)


def test_a_topic_recreated_behind_the_saved_offset_is_read_again_from_its_start(
    served_topic: TopicFactory,
) -> None:
    topic, serve = _recreated_behind_serve(served_topic, "recreated", 31)

    m = serve.wait_for(caught_up(130), 60, "the 30 records of the recreated topic")
    resets = m.by_labels("ragpulse_offset_resets_total")
    assert resets == {
        (("kind", "beyond_end"), ("topic", topic.name)): 1,
        (("kind", "below_start"), ("topic", topic.name)): 0,
    }
    # earliest loses nothing that can still be read.
    assert m.total("ragpulse_records_lost_total", topic=topic.name) == 0
    assert m.value("ragpulse_events_total", outcome="accepted") == 130
    assert saved_offsets(topic.state, topic.name) == {0: 30}
    assert "saved offset 100 is beyond the end of the partition" in serve.log_text()
    assert serve.terminate() == 0

    # The counts survive a restart like every other counter, and the reset is not seen again.
    serve = topic.serve()
    m = serve.wait_for(
        lambda s: s.total("ragpulse_cycles_total", outcome="ok") >= 2, 30, "two cycles"
    )
    assert m.by_labels("ragpulse_offset_resets_total") == resets
    assert m.value("ragpulse_events_total", outcome="accepted") == 130
    assert serve.terminate() == 0


def test_on_offset_reset_latest_skips_what_the_recreated_topic_holds_and_counts_it_lost(
    served_topic: TopicFactory,
) -> None:
    topic, serve = _recreated_behind_serve(served_topic, "recreated-latest", 41, "latest")

    m = serve.wait_for(
        lambda s: s.value("ragpulse_offset_resets_total", topic=topic.name, kind="beyond_end")
        == 1,
        60,
        "the reset",
    )
    assert m.value("ragpulse_records_lost_total", topic=topic.name, reason="topic_reset") == 30
    assert m.value("ragpulse_records_lost_total", topic=topic.name, reason="retention") == 0
    topic.produce(events(42, 5, T0 + 20))  # what comes after is read
    m = serve.wait_for(caught_up(105), 60, "the records produced after the reset")
    assert m.value("ragpulse_events_total", outcome="accepted") == 105
    assert saved_offsets(topic.state, topic.name) == {0: 35}
    assert serve.terminate() == 0


def test_on_offset_reset_fail_stops_serve_with_a_clear_error_and_keeps_the_saved_offsets(
    served_topic: TopicFactory,
) -> None:
    topic, serve = _recreated_behind_serve(served_topic, "recreated-fail", 51, "fail")

    assert serve.process is not None
    assert serve.process.wait(timeout=60) == 3
    log = serve.log_text()
    assert "stopping: offsets saved in" in log and "--on-offset-reset is fail" in log
    assert "Traceback" not in log
    assert saved_offsets(topic.state, topic.name) == {0: 100}


# --- records over the size limit ---------------------------------------------------------------


def test_records_of_2_and_10_mb_are_dead_lettered_as_their_head_and_the_rest_is_judged(
    served_topic: TopicFactory,
) -> None:
    topic = served_topic("oversized")
    normal = events(61, 60)
    big = {
        20: json.dumps({"request_id": "big-2", "response": "x" * (2 << 20)}).encode(),
        40: json.dumps({"request_id": "big-10", "response": "y" * (10 << 20)}).encode(),
    }
    values = list(normal)
    for at in sorted(big):  # ascending: each lands at its index
        values.insert(at, big[at])
    # The test's producer takes records of up to 16 MiB; Tansu accepts them as they are. The
    # 10 MiB one is also over the reader's 8 MiB fetch size per partition.
    placed = topic.broker.produce(topic.name, values, partition=0, max_request_size=16 << 20)
    offset_of = {at: placed[at][1] for at in big}

    serve = topic.serve()
    m = serve.wait_for(caught_up(62), 90, "all 62 records")
    assert m.value("ragpulse_events_total", outcome="accepted") == 60
    assert m.value("ragpulse_events_total", outcome="invalid") == 2
    for judge in ("groundedness", "safety", "relevance_to_query"):
        assert m.total("ragpulse_judge_verdicts_total", judge=judge) == 60

    letters = topic.read("dlq", 2)
    assert len(letters) == 2
    for letter in letters:
        headers = {k: v.decode() for k, v in letter.headers}
        at = next(i for i, o in offset_of.items() if str(o) == headers["source-offset"])
        assert headers["source-partition"] == "0"
        assert headers["original-size"] == str(len(big[at]))
        assert headers["truncated"] == "true"
        assert f"record is {len(big[at])} bytes, over the 1048576-byte limit" in headers["reason"]
        assert letter.value == big[at][:4096]  # the head, never the whole record
    assert serve.terminate() == 0


# --- dead letters the broker does not take ------------------------------------------------------


def _with_bad_records(
    served_topic: TopicFactory, name: str, seed: int
) -> tuple[ServedTopic, list[int]]:
    """The topic, holding 50 valid events and then 5 invalid ones (JSON objects with no
    request nor response), and the offsets of those 5."""
    topic = served_topic(name)
    invalid = [json.dumps({"request_id": f"bad-{i}"}).encode() for i in range(5)]
    placed = topic.produce([*events(seed, 50), *invalid])
    return topic, [offset for _, offset in placed[50:]]


def test_dead_letters_the_topic_refuses_are_counted_undeliverable_at_once_and_the_cycle_moves_on(
    served_topic: TopicFactory, schema_dir: Path
) -> None:
    # The dead-letter topic only takes JSON objects with a field no dead letter has.
    (schema_dir / "dlq-refuses.dlq.json").write_text(
        json.dumps({"type": "object", "properties": {"value": {"required": ["never_there"]}}})
    )
    topic, _ = _with_bad_records(served_topic, "dlq-refuses", 71)
    serve = topic.serve()
    m = serve.wait_for(caught_up(55), 60, "all 55 records")
    m = serve.wait_for(
        lambda s: s.value("ragpulse_dead_letters_undeliverable_total", topic="dlq-refuses.dlq")
        == 5,
        30,
        "5 undeliverable dead letters",
    )
    assert m.value("ragpulse_events_total", outcome="invalid") == 5
    assert m.value("ragpulse_cycles_total", outcome="failed") == 0  # refused for good: no retry
    assert m.value("ragpulse_dead_letters_undeliverable_total", topic="dlq-refuses.verdicts") == 0
    assert saved_offsets(topic.state, topic.name) == {0: 55}
    log = serve.log_text()
    assert "5 records for dlq-refuses.dlq are undeliverable" in log
    assert "INVALID_RECORD" in log or "InvalidRecordError" in log
    assert serve.terminate() == 0


def test_dead_letters_a_broken_topic_never_acknowledges_are_given_up_after_the_budget(
    served_topic: TopicFactory, schema_dir: Path
) -> None:
    # A schema file that is not JSON: every produce to the topic fails with a server error.
    (schema_dir / "dlq-broken.dlq.json").write_text("{not a schema")
    topic, _ = _with_bad_records(served_topic, "dlq-broken", 81)
    serve = topic.serve("--undeliverable-after", "3s")
    m = serve.wait_for(caught_up(55), 90, "the cycle given up on after 3 s")
    assert m.value("ragpulse_dead_letters_undeliverable_total", topic="dlq-broken.dlq") == 5
    assert (m.value("ragpulse_cycles_total", outcome="failed") or 0) >= 2  # retried first
    assert m.value("ragpulse_events_total", outcome="accepted") == 50
    assert saved_offsets(topic.state, topic.name) == {0: 55}
    assert "given up after 3s" in serve.log_text()
    assert serve.terminate() == 0


def test_a_dead_letter_topic_failing_for_less_than_the_budget_loses_nothing(
    served_topic: TopicFactory, schema_dir: Path
) -> None:
    schema = schema_dir / "dlq-transient.dlq.json"
    schema.write_text("{not a schema")
    topic, bad_offsets = _with_bad_records(served_topic, "dlq-transient", 91)
    serve = topic.serve()
    m = serve.wait_for(
        lambda s: (s.value("ragpulse_cycles_total", outcome="failed") or 0) >= 2,
        60,
        "two failed cycles",
    )
    assert m.total("ragpulse_events_total") == 0  # nothing saved while the letters wait
    schema.write_text(json.dumps({"type": "object"}))  # the topic is repaired
    m = serve.wait_for(caught_up(55), 60, "the cycle once the topic takes records again")
    assert m.value("ragpulse_dead_letters_undeliverable_total", topic="dlq-transient.dlq") == 0
    letters = topic.read("dlq", 5)
    # At least once: every dead letter is there (a retried cycle may have sent some twice).
    assert {int(dict(r.headers)["source-offset"]) for r in letters} == set(bad_offsets)
    assert saved_offsets(topic.state, topic.name) == {0: 55}
    assert serve.terminate() == 0
