"""/metrics and /healthz answer promptly while `ragpulse serve` judges a batch of heavy events.

Prometheus gives up on a scrape after its timeout (10 s by default) and a kubelet probe after
1 s; a cycle that kept the HTTP thread from running (the GIL held for seconds by a regex over a
large answer, say) would mark the target down and restart the pod. The events here have
~100 KB answers and ten ~8 KB chunks, judged by the local judges in one cycle. The cycle hooks
(pipeline/service/cycle_hooks.py) hold serve before the graph runs, while a scraper starts
asking back to back, and after it, so the scrapes that count are known to have been answered
while the heavy graph ran, whatever the machine's speed.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
from cycle_holds import CycleHolds
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from serve_process import serve_processes_fixture  # noqa: F401
from test_serve import T0, ServeFactory, caught_up

from ragpulse.pipeline.commands.simulate import simulate

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
    holds = CycleHolds(tmp_path / "hooks")
    serve = serve_processes(
        kafka_broker.bootstrap, topic, tmp_path / "state.sqlite",
        ["--window", "10s", "--max-batch-events", str(HEAVY_EVENTS)],
        env=holds.env,
    ).start()
    serve.wait_for(lambda m: m.total("ragpulse_cycles_total", outcome="ok") >= 1, 60)

    # (path, asked at, answered at, error) of every request, from one thread, back to back.
    requests: list[tuple[str, float, float, str | None]] = []
    stop = threading.Event()

    def scrape_all_along() -> None:
        while not stop.is_set():
            for path in ("/metrics", "/healthz"):
                asked = time.time()
                error = None
                try:
                    with urllib.request.urlopen(serve.url + path, timeout=30) as response:
                        response.read()
                except OSError as exc:
                    error = str(exc)
                requests.append((path, asked, time.time(), error))

    holds.hold("planned")
    holds.hold("judged")
    events = [heavy(e.payload, i) for i, e in enumerate(simulate(3, HEAVY_EVENTS, T0, rate=10))]
    kafka_broker.produce(topic, events, partition=0)
    holds.wait_at("planned", serve)
    scraper = threading.Thread(target=scrape_all_along, daemon=True)
    scraper.start()
    while len(requests) < 2:  # the scraper is going before the graph starts
        time.sleep(0.01)
    graph_started = time.time()
    holds.release("planned")
    graph_ended = holds.wait_at("judged", serve)
    stop.set()
    scraper.join(timeout=60)
    holds.release("judged")
    scrape = serve.wait_for(caught_up(HEAVY_EVENTS), 300, "the heavy batch saved")

    during = [r for r in requests if r[1] >= graph_started and r[2] <= graph_ended]
    slowest = {p: max((end - asked for q, asked, end, _ in requests if q == p), default=0.0)
               for p in ("/metrics", "/healthz")}
    print(f"graph over the heavy batch: {graph_ended - graph_started:.1f}s; "
          f"{len(requests)} requests, {len(during)} answered while it ran; slowest {slowest}")
    assert scrape.value("ragpulse_events_total", outcome="accepted") == HEAVY_EVENTS
    assert [r for r in requests if r[3] is not None] == []
    assert {r[0] for r in during} == {"/metrics", "/healthz"}, "no request answered mid-graph"
    for path, seconds in slowest.items():
        assert seconds < SCRAPE_BOUND_S, f"{path} took {seconds:.1f}s during a cycle"
    assert serve.terminate() == 0
