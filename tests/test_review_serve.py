"""A real `ragpulse serve` on a real Apache Kafka broker publishes review items: the random slice
exactly as the hash decides, failing verdicts as targeted items, each item whole and readable,
counted on /metrics, and held back by the hourly bound."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from kafka_broker import ApacheKafkaBroker, for_module
from serve_process import T0, TopicFactory, caught_up

from ragpulse.pipeline.commands.simulate import Incidents, simulate
from ragpulse.pipeline.formats.events import parse_event
from ragpulse.pipeline.formats.review import decode_item
from ragpulse.pipeline.stages.review import in_random_slice

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(240)]

DROP = Incidents(groundedness_drop_at=0.0, drop_to=0.5)
EVENTS = 120


@pytest.fixture(scope="module")
def broker(apache_kafka: ApacheKafkaBroker) -> Iterator[ApacheKafkaBroker]:
    yield from for_module(apache_kafka)


def test_serve_publishes_the_random_slice_and_failing_verdicts_as_review_items(
    served_topic: TopicFactory,
) -> None:
    records = list(simulate(5, EVENTS, T0, rate=2, incidents=DROP))
    topic = served_topic("reviewed", records=records)
    serve = topic.serve("--review-rate", "0.25", "--review-max-per-hour", "1000")
    scrape = serve.wait_for(caught_up(EVENTS), 90, "all events judged")
    queued = scrape.by_labels("ragpulse_review_queued_total")
    total = int(sum(queued.values()))
    assert total > 0

    items = [decode_item(r.value) for r in topic.read("review", total)]
    assert len(items) == total  # every item published once, none refused
    by_id = {i.event_id: i for i in items}
    assert len(by_id) == total
    events = {
        e.request_id: e
        for e in (parse_event(r.payload) for r in records if r.kind != "malformed")
    }
    request_ids = list(events)
    # The random slice is exactly the hash's choice among the judged events.
    random_ids = {i.event_id for i in items if i.reason == "random"}
    assert random_ids == {r for r in request_ids if in_random_slice(r, 0.25)}
    # Every other judged event with a `no` is queued as failing, naming the judges that said no.
    failing = [i for i in items if i.reason == "failing"]
    assert failing, "the groundedness drop gives failing verdicts"
    for item in failing:
        said_no = {v.judge for v in item.verdicts if v.rating == "no"}
        assert set(item.reason_judges) == said_no and said_no
        assert item.event_id not in random_ids
    counted = Counter(i.reason for i in items)
    assert {dict(k)["reason"]: int(v) for k, v in queued.items()} == dict(counted)
    # What a reviewer needs is in the item.
    sample = items[0]
    source = events[sample.event_id].judge_input
    assert (sample.request, sample.response) == (source.question, source.answer)
    assert [c.content for c in sample.chunks] == [c.content for c in source.chunks]
    assert sample.verdicts
    assert all(v.prompt_version == "local" for v in sample.verdicts)
    assert sample.window_end.timestamp() - sample.window_start.timestamp() == 10
    assert serve.terminate() == 0


def test_the_hourly_bound_holds_items_back_and_counts_them(served_topic: TopicFactory) -> None:
    records = simulate(6, EVENTS, T0, rate=2, incidents=DROP)
    topic = served_topic("bounded", records=records)
    serve = topic.serve("--review-rate", "0.5", "--review-max-per-hour", "6")
    scrape = serve.wait_for(caught_up(EVENTS), 90, "all events judged")
    assert scrape.total("ragpulse_review_queued_total") == 6
    held = scrape.by_labels("ragpulse_review_held_back_total")
    assert sum(held.values()) > 0
    items = [decode_item(r.value) for r in topic.read("review", 6)]
    assert len(items) == 6
    # Targeted items take at most half of the bound: the random slice is never crowded out.
    assert sum(1 for i in items if i.reason != "random") <= 3
    assert serve.terminate() == 0
