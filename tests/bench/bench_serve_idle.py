"""What an idle `ragpulse serve` costs: CPU of serve and of the Apache Kafka broker it watches.

For whoever changes what serve asks the broker each cycle. One Apache Kafka broker
(`tests/kafka_broker.ApacheKafkaBroker`) runs throughout; each round measures it alone for
--seconds, then, for each checkout in turn (interleaved, so drift hits all alike), starts one
serve with the tests' flags (`tests/serve_process.ServeProcess`: --trigger-interval 0.5s,
--kafka-timeout 5s, local judges) on a new 2-partition topic (empty, or holding --records
simulated events, which serve reads first), waits for three cycles with nothing to read, and
measures for --seconds: CPU of serve and of the broker (% of one core, from /proc), the
cycles run, and the TCP connections serve opened to the broker (socket inodes first seen).
Prints per checkout the median over --rounds, and the ratios to the first checkout.

    .venv/bin/python tests/bench/bench_serve_idle.py [--seconds 60] [--rounds 3] [--records 0] \\
        [--code DIR --code DIR]

--code DIR runs the serve of another checkout (on PYTHONPATH, with this .venv); without it,
this checkout. `git archive REV | tar -x -C DIR` makes one of any revision.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from kafka_broker import ApacheKafkaBroker  # noqa: E402
from process_sockets import connections_to, cpu_seconds  # noqa: E402
from serve_process import (  # noqa: E402
    T0,
    Scrape,
    ServeProcess,
    caught_up,
    produce_round_robin,
)

from ragpulse.pipeline.commands.simulate import simulate  # noqa: E402

TOPIC_PARTITIONS = 2
# How often serve's connections are listed: a shorter-lived connection may be missed.
SAMPLE_S = 0.05


@dataclass(frozen=True)
class Idle:
    """One checkout's serve idling for one round."""

    serve_core: float  # % of one core
    broker_core: float
    cycles: float
    connections: int  # new TCP connections serve opened to the broker


class CodeServe(ServeProcess):
    """ServeProcess running the serve of checkout `code` (None: this one)."""

    def __init__(self, code: Path | None, *args: object, **kwargs: object) -> None:
        self.code = code
        env = dict(os.environ)
        if code is not None:
            env["PYTHONPATH"] = str(code)
        super().__init__(*args, env=env, **kwargs)  # type: ignore[arg-type]

    def command(self) -> list[str]:
        if self.code is None:
            return super().command()
        # -P: not the working directory first on sys.path, so that PYTHONPATH wins.
        return [sys.executable, "-P", "-m", "ragpulse.pipeline.cli", *self.serve_args()]


def cycles(scrape: Scrape) -> float:
    return scrape.total("ragpulse_cycles_total") if scrape.select("ragpulse_cycles_total") else 0


def idle_round(
    broker: ApacheKafkaBroker,
    code: Path | None,
    topic: str,
    workdir: Path,
    seconds: float,
    records: int,
) -> Idle:
    broker.create_topic(topic, TOPIC_PARTITIONS)
    if records:
        produce_round_robin(broker, topic, list(simulate(3, records, T0, rate=10)),
                            TOPIC_PARTITIONS)
    serve = CodeServe(code, broker.bootstrap, topic, workdir / f"{topic}.sqlite")
    try:
        serve.start()
        serve.wait_for(caught_up(records), 120, f"the {records} records")
        done = cycles(serve.metrics())
        serve.wait_for(lambda m: cycles(m) >= done + 3, 120, "3 idle cycles")
        pid, port = serve.process.pid, int(broker.bootstrap.rsplit(":", 1)[1])  # type: ignore[union-attr]
        seen = set(connections_to(pid, port))
        first = cycles(serve.metrics())
        serve_cpu, broker_cpu = cpu_seconds(pid), cpu_seconds(broker.pid)
        started = time.monotonic()
        new: set[int] = set()
        while time.monotonic() - started < seconds:
            time.sleep(SAMPLE_S)
            new |= connections_to(pid, port) - seen
        took = time.monotonic() - started
        serve_used, broker_used = cpu_seconds(pid) - serve_cpu, cpu_seconds(broker.pid) - broker_cpu
        ran = cycles(serve.metrics()) - first
    finally:
        serve.stop()
    return Idle(100 * serve_used / took, 100 * broker_used / took, ran, len(new))


def broker_alone(broker: ApacheKafkaBroker, seconds: float) -> float:
    used = cpu_seconds(broker.pid)
    started = time.monotonic()
    time.sleep(seconds)
    return 100 * (cpu_seconds(broker.pid) - used) / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=0,
                        help="events on the topic, read before serve idles (default none)")
    parser.add_argument("--code", action="append", type=Path, default=[], metavar="DIR")
    args = parser.parse_args()
    codes: list[Path | None] = list(args.code) or [None]
    names = ["this checkout" if c is None else str(c) for c in codes]
    alone: list[float] = []
    found: dict[str, list[Idle]] = {n: [] for n in names}
    with (
        tempfile.TemporaryDirectory(prefix="bench-serve-idle-") as tmp,
        ApacheKafkaBroker() as broker,  # started
    ):
        time.sleep(5)  # past the broker's start-up work
        for r in range(args.rounds):
            alone.append(broker_alone(broker, args.seconds))
            print(f"round {r + 1}: broker alone {alone[-1]:.1f} % of a core", flush=True)
            for i, (code, name) in enumerate(zip(codes, names, strict=True)):
                idle = idle_round(
                    broker, code, f"idle-{r}-{i}", Path(tmp), args.seconds, args.records
                )
                found[name].append(idle)
                print(f"round {r + 1}: {name}: {idle}", flush=True)
    med = statistics.median
    print(f"\nIdle serve ({args.records} records read first), {args.seconds:.0f} s per measure, "
          f"median of {args.rounds} rounds; "
          f"broker alone {med(alone):.1f} % of a core\n")
    print("| serve code | serve % core | broker % core | broker added | cycles | "
          "new connections seen |")
    print("|---|---|---|---|---|---|")
    base = found[names[0]]
    base_added = med(r.broker_core for r in base) - med(alone)
    for name in names:
        runs = found[name]
        broker_core = med(r.broker_core for r in runs)
        print(f"| {name} | {med(r.serve_core for r in runs):.1f} | {broker_core:.1f} | "
              f"{broker_core - med(alone):.1f} | {med(r.cycles for r in runs):.0f} | "
              f"{med(r.connections for r in runs):.0f} |")
    for name in names[1:]:
        runs = found[name]
        print(f"\n{name} / {names[0]}: serve CPU x"
              f"{med(r.serve_core for r in runs) / med(r.serve_core for r in base):.2f}, "
              f"broker CPU added x"
              f"{(med(r.broker_core for r in runs) - med(alone)) / max(1e-9, base_added):.2f}")


if __name__ == "__main__":
    main()
