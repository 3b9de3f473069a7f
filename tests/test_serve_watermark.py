"""serve's watermark against one hostile record and one quiet partition, end to end: `ragpulse
serve` as a subprocess on a real Kafka-protocol broker.

- One event dated 2099 (a client clock, a unit bug) is refused as future-dated, with its
  reason, and the events after it are counted; before --max-future-skew it moved the
  watermark to 2099 and every later event was dead-lettered as late (400 of 400).
- A partition that was caught up for a cycle while another ran ahead is not idle within
  --partition-idle-after, so its next events are not late; at 0 s (the behaviour before the
  grace) the same cycle made them late.

Every step waits for what serve reports (events read, a cycle completed), never a delay.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from serve_process import (
    T0,
    Scrape,
    caught_up,
    read_topic,
    serve_processes_fixture,  # noqa: F401
)
from test_serve import ServeFactory

from ragpulse.pipeline.commands.simulate import simulate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

YEAR_2099_MS = 4_070_908_800_000
ARGS = ["--window", "10s", "--allowed-lateness", "0s", "--out-of-orderness", "0s"]


def cycles(scrape: Scrape) -> float:
    return scrape.total("ragpulse_cycles_total", outcome="ok")


def test_one_event_dated_2099_is_refused_and_the_events_after_it_are_counted(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
    serve_processes: ServeFactory,
    tmp_path: Path,
) -> None:
    topic = "future"
    kafka_broker.create_topic(topic, 1)
    poison = orjson.loads(next(iter(simulate(8, 1, T0))).payload)
    poison["timestamp"] = YEAR_2099_MS
    kafka_broker.produce(topic, [orjson.dumps(poison)], partition=0)
    serve = serve_processes(kafka_broker.bootstrap, topic, tmp_path / "state.sqlite", ARGS)
    serve.start().wait_for(caught_up(1), 60, "the 2099 event read")

    events = list(simulate(9, 400, T0, rate=10))
    kafka_broker.produce(topic, [e.payload for e in events], partition=0)
    last = max(e.event_time for e in events)
    m = serve.wait_for(caught_up(401), 120, "the 400 later events read")

    accepted = m.value("ragpulse_events_total", outcome="accepted")
    late = m.total("ragpulse_late_events_total")
    print(f"after one event dated 2099: {accepted} accepted, {late} late of 400")
    assert late == 0
    assert accepted == 400
    assert m.value("ragpulse_events_total", outcome="invalid") == 1
    assert m.total("ragpulse_events_judged_total") == 400
    # The watermark follows the real events; the 2099 one never moved it.
    m = serve.wait_for(caught_up(401, last), 60, "the watermark at the last real event")
    assert m.value("ragpulse_watermark_timestamp_seconds") == last
    letters = read_topic(kafka_broker.bootstrap, f"{topic}.dlq", 1)
    assert len(letters) == 1
    reason = dict(letters[0].headers)["reason"].decode()
    assert reason.startswith("future-dated event: its time 2099-01-01T00:00:00Z is")
    assert "--max-future-skew 300s" in reason
    assert serve.terminate() == 0


@pytest.mark.parametrize(("idle_after", "late_expected"), [("60s", 0), ("0s", 3)])
def test_a_partition_caught_up_for_a_cycle_keeps_the_watermark_within_the_grace(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
    serve_processes: ServeFactory,
    tmp_path: Path,
    idle_after: str,
    late_expected: int,
) -> None:
    topic = "quiet"
    kafka_broker.create_topic(topic, 2)
    events = [orjson.loads(e.payload) for e in simulate(10, 6, T0, rate=1)]

    def at(second: float, n: int) -> bytes:
        return orjson.dumps({**events[n], "timestamp": int((T0 + second) * 1000)})

    # Partition 0 runs to 25 s; partition 1 stops at 2 s (its producer pauses).
    kafka_broker.produce(topic, [at(1, 0), at(25, 1)], partition=0)
    kafka_broker.produce(topic, [at(2, 2)], partition=1)
    serve = serve_processes(
        kafka_broker.bootstrap, topic, tmp_path / "state.sqlite",
        [*ARGS, "--partition-idle-after", idle_after],
    ).start()
    m = serve.wait_for(caught_up(3), 60, "the first three events read")
    # One more cycle with nothing to read: both partitions are caught up.
    serve.wait_for(lambda s: cycles(s) > cycles(m), 60, "a cycle with nothing new")
    # Partition 1's producer goes on where it was: window [0 s, 10 s) of the topic.
    kafka_broker.produce(topic, [at(3, 3), at(4, 4), at(5, 5)], partition=1)
    m = serve.wait_for(caught_up(6), 60, "partition 1's next events read")

    print(f"--partition-idle-after {idle_after}: {m.total('ragpulse_late_events_total')} late")
    assert m.total("ragpulse_late_events_total") == late_expected
    assert serve.terminate() == 0
