"""An idle `ragpulse serve` keeps its connections to the broker from cycle to cycle.

Each cycle asks the broker the topic's bounds, the labels and review topics' bounds, and the
consumer group's commits, then commits. With a new consumer per question, every cycle opened
(and closed) several connections, which cost CPU in serve and in the broker while nothing
arrived. serve keeps its consumers (`pipeline.sources.kafka.KafkaClients`): after the first
cycles, no new connection to the broker is opened while it idles. The connections are read from
/proc (`tests/process_sockets.py`), at cycle boundaries read from /metrics, not timed.
"""

from __future__ import annotations

import time
from pathlib import Path

from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from process_sockets import connections_to
from serve_process import Scrape, serve_processes_fixture  # noqa: F401
from test_serve import T0, ServeFactory, caught_up, produce_round_robin

from ragpulse.pipeline.commands.simulate import simulate

IDLE_CYCLES = 10


def cycles(scrape: Scrape) -> float:
    return scrape.total("ragpulse_cycles_total") if scrape.select("ragpulse_cycles_total") else 0


def test_a_serve_gone_idle_opens_no_new_broker_connection_over_ten_cycles(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
    serve_processes: ServeFactory,
    tmp_path: Path,
) -> None:
    kafka_broker.create_topic("idle", 2)
    # Records on both partitions: their ends are checked by a fetch once, not every cycle.
    produce_round_robin(kafka_broker, "idle", list(simulate(3, 40, T0, rate=10)), 2)
    serve = serve_processes(kafka_broker.bootstrap, "idle", tmp_path / "state.sqlite").start()
    assert serve.process is not None
    pid, port = serve.process.pid, int(kafka_broker.bootstrap.rsplit(":", 1)[1])
    serve.wait_for(caught_up(40), 60, "the 40 events")
    # Two cycles on, serve has asked every question of an idle cycle once.
    done = cycles(serve.metrics())
    serve.wait_for(lambda m: cycles(m) >= done + 2, 60, "2 idle cycles")
    kept = connections_to(pid, port)
    assert kept, "serve holds no connection to the broker between cycles"
    seen = set(kept)
    first = cycles(serve.metrics())
    while cycles(scrape := serve.metrics()) < first + IDLE_CYCLES:
        assert serve.running, serve.log_tail()
        seen |= connections_to(pid, port)
        time.sleep(0.05)
    assert scrape.total("ragpulse_cycles_total", outcome="failed") == 0
    assert connections_to(pid, port) == kept
    assert seen == kept, f"{len(seen - kept)} connections opened while idle"
    assert serve.terminate() == 0
