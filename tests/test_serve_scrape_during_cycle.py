"""/metrics and /healthz answer promptly while `ragpulse serve` judges a batch of heavy events.

Prometheus gives up on a scrape after its timeout (10 s by default) and a kubelet probe after
1 s; a cycle that kept the HTTP thread from running (the GIL held for seconds by a regex over a
large answer, say) would mark the target down and restart the pod. The events here have
~100 KB answers and ten ~8 KB chunks, judged by the local judges, so one cycle takes seconds.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from serve_process import serve_processes_fixture  # noqa: F401
from test_serve import T0, ServeFactory, caught_up

from pipeline.commands.simulate import simulate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HEAVY_EVENTS = 120
SCRAPE_BOUND_S = 2.0


def heavy(payload: bytes, i: int) -> bytes:
    """A simulated event blown up: a ~100 KB answer and ten ~8 KB retrieved chunks."""
    event = orjson.loads(payload)
    event.pop("trace", None)
    event["response"] = " ".join(
        f"The warranty lasts {n % 5} years and covers parts (note {n} of event {i})."
        for n in range(2_000)
    )[:100_000]
    event["retrieved_context"] = [
        {"content": " ".join(f"Fact {n}.{c}: the warranty lasts {c} years." for c in range(200))
         [:8_000], "doc_uri": f"kb/{n}"}
        for n in range(10)
    ]
    return orjson.dumps(event)


def test_metrics_and_healthz_answer_within_two_seconds_throughout_a_cycle_of_heavy_events(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
    serve_processes: ServeFactory,
    tmp_path: Path,
) -> None:
    topic = "heavy"
    kafka_broker.create_topic(topic, 1)
    serve = serve_processes(
        kafka_broker.bootstrap, topic, tmp_path / "state.sqlite",
        ["--window", "10s", "--max-batch-events", str(HEAVY_EVENTS)],
    ).start()
    serve.wait_for(lambda m: m.total("ragpulse_cycles_total", outcome="ok") >= 1, 60)

    slowest: dict[str, float] = {"/metrics": 0.0, "/healthz": 0.0}
    scrapes = 0
    failures: list[str] = []
    stop = threading.Event()

    def scrape_all_along() -> None:
        nonlocal scrapes
        while not stop.is_set():
            for path in slowest:
                started = time.monotonic()
                try:
                    with urllib.request.urlopen(serve.url + path, timeout=30) as response:
                        response.read()
                except OSError as exc:
                    failures.append(f"{path}: {exc}")
                slowest[path] = max(slowest[path], time.monotonic() - started)
                scrapes += 1
            time.sleep(0.1)

    scraper = threading.Thread(target=scrape_all_along, daemon=True)
    scraper.start()
    events = [heavy(e.payload, i) for i, e in enumerate(simulate(3, HEAVY_EVENTS, T0, rate=10))]
    kafka_broker.produce(topic, events, partition=0)
    scrape = serve.wait_for(caught_up(HEAVY_EVENTS), 300, "the heavy batch judged")
    stop.set()
    scraper.join(timeout=60)

    cycle_seconds = scrape.total("ragpulse_cycle_duration_seconds_sum")
    print(f"heavy cycle(s): {cycle_seconds:.1f}s; {scrapes} requests, slowest {slowest}")
    assert scrape.value("ragpulse_events_total", outcome="accepted") == HEAVY_EVENTS
    assert cycle_seconds >= 3.0, "the batch was too light to test anything"
    assert scrapes >= 10 and not failures
    for path, seconds in slowest.items():
        assert seconds < SCRAPE_BOUND_S, f"{path} took {seconds:.1f}s during a cycle"
    assert serve.terminate() == 0
