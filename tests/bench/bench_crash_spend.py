"""What crashes cost in judge calls and budget: calls paid per call needed, tokens counted per
token paid, and the hour's spend per hourly budget, for `ragpulse serve` SIGKILLed over and over.

For whoever runs serve where it may be killed (OOM, node drains, crash loops) with a paid LLM
judge. Each scenario runs real serve processes on a real (Tansu) broker and the stand-in LLM
endpoint (tests/fake_openai.py, which counts every request and token), once for each code tree
given (e.g. the main checkout and this one), side by side in one run:

    kills   N events, two judges; serve is SIGKILLed K times, each time at a random moment
            (0-0.5 s) after the stand-in has answered a random number (5..60) of new calls
            since that process started (so kills land mid-cycle), then a last serve reads the
            rest. Reported: calls paid / calls needed (distinct judge inputs), and tokens
            counted in ragpulse_judge_tokens_total / tokens the stand-in served (also leaving
            out the calls answered after the serve that sent them was dead).
    budget  --judge-budget-per-hour B with events arriving all along; serve is SIGKILLed R
            times, each time once it has committed a cycle that judged something. Reported:
            tokens paid / B (all within one clock hour; the run says if the hour ended), and
            the largest ragpulse_judge_budget_spent_this_hour seen / B.
    pace    the issue's scenario: --judge-budget-per-hour B with --rate events a second arriving
            for --seconds; serve restarted (SIGKILL, then a new process) every --restart-every
            seconds from its launch, or once it has committed its first cycle if that is later
            (a busy machine starts serve slowly), and one process over the same traffic.
            Reported: tokens paid / B for each, and how many processes ran.
            Each run's serves share a clock (libfaketime) that starts at --start-second of an
            hour (default 60), so the pace, which depends on the seconds left in the hour, is
            the same for every code, and no run crosses an hour (which would reset the spend).

    .venv/bin/python tests/bench/bench_crash_spend.py --code /work/main --code . [--kills K]
        [--events N] [--restarts R] [--budget B] [--scenarios kills,budget,pace]
        [--rate E] [--seconds S] [--restart-every P] [--start-second T]
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fake_openai import FakeOpenAI, RecordedRequest, request_identity
from kafka_broker import ApacheKafkaBroker
from serve_process import Scrape, ServeProcess, caught_up
from test_serve_call_journal import clock_at, distinct_events


def serve_args(endpoint: FakeOpenAI, *extra: str) -> list[str]:
    return [
        "--window", "1h",
        "--judges", "safety,groundedness",
        "--judge-backend", "openai",
        "--judge-base-url", endpoint.base_url,
        "--judge-max-retries", "0",
        "--judge-concurrency", "4",
        "--max-batch-events", "60",
        "--trigger-interval", "0.2s",
        *extra,
    ]  # fmt: skip


class ServeWithoutHealthPort(ServeProcess):
    """serve from a code tree older than --health-port (before issue 31)."""

    def serve_args(self) -> list[str]:
        args = super().serve_args()
        at = args.index("--health-port")
        return args[:at] + args[at + 2 :]


def serve_class(code: Path) -> type[ServeProcess]:
    flags = (code / "pipeline" / "settings" / "command_flags.py").read_text()
    return ServeProcess if "--health-port" in flags else ServeWithoutHealthPort


def ok_calls(endpoint: FakeOpenAI) -> list[RecordedRequest]:
    return [r for r in endpoint.requests if r.outcome == "ok"]


def tokens(r: RecordedRequest) -> int:
    return r.prompt_tokens + r.completion_tokens


def tokens_counted(scrape: Scrape) -> float:
    return scrape.total("ragpulse_judge_tokens_total", kind="prompt") + scrape.total(
        "ragpulse_judge_tokens_total", kind="completion"
    )


def wait(condition: object, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


def kills(code: Path, n_events: int, n_kills: int, seed: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code.resolve())}
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp, ApacheKafkaBroker() as broker, FakeOpenAI(
        latency=0.05
    ) as endpoint:
        state = Path(tmp) / "state.sqlite"
        broker.create_topic("kills", 1)
        broker.produce("kills", distinct_events(n_events), partition=0)
        kills_at: list[float] = []
        for _ in range(n_kills):
            serve = serve_class(code)(
                broker.bootstrap, "kills", state, serve_args(endpoint), env=env
            )
            serve.start()
            before = len(ok_calls(endpoint))
            target = before + rnd.randint(5, 60)
            try:
                wait(lambda target=target, serve=serve: len(ok_calls(endpoint)) >= target
                     or serve_done(serve, n_events))
                time.sleep(rnd.uniform(0.0, 0.5))  # then at a random moment
            finally:
                kills_at.append(time.monotonic())  # before: kill() waits for the process
                serve.kill()
                serve.stop()  # removes its temp folder
        final = serve_class(code)(broker.bootstrap, "kills", state, serve_args(endpoint), env=env)
        final.start()
        scrape = final.wait_for(
            lambda m: caught_up(n_events)(m)
            and m.total("ragpulse_judge_verdicts_total") == 2 * n_events,
            600,
            "every event judged",
        )
        final.terminate()
        final.stop()
        calls = ok_calls(endpoint)
        needed = len({request_identity(c.body) for c in calls})
        # Answered after serve was killed while waiting: paid, but never seen by serve.
        unseen = [c for c in calls
                  if any(c.received_at < k < c.answered_at for k in kills_at)]
        served = sum(tokens(c) for c in calls)
        return {
            "calls paid": len(calls),
            "calls needed (distinct inputs)": needed,
            "paid / needed": len(calls) / needed,
            "tokens counted / served": tokens_counted(scrape) / served,
            "  ... / served to live serve": tokens_counted(scrape)
            / (served - sum(tokens(c) for c in unseen)),
        }


def serve_done(serve: ServeProcess, n_events: int) -> bool:
    try:
        return caught_up(n_events)(serve.metrics())
    except OSError:
        return False


def committed_all(seen: int) -> Callable[[Scrape], bool]:
    return lambda m: (
        m.total("ragpulse_cycles_total", outcome="ok") >= 1
        and m.total("ragpulse_seen_events_total") >= seen
    )


def budget(code: Path, restarts: int, per_hour: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code.resolve())}
    hour = math.floor(time.time() / 3600)
    events = distinct_events(40 * (restarts + 2))
    args_extra = ("--judge-budget-per-hour", str(per_hour), "--judge-min-sample-rate", "0")
    gauge_max = 0.0
    with tempfile.TemporaryDirectory() as tmp, ApacheKafkaBroker() as broker, FakeOpenAI(
        latency=0.02
    ) as endpoint:
        state = Path(tmp) / "state.sqlite"
        broker.create_topic("budget", 1)
        for r in range(restarts):
            # 40 new events for each process: its first cycle judges a probe of them.
            broker.produce("budget", events[40 * r : 40 * (r + 1)], 0)
            serve = serve_class(code)(
                broker.bootstrap, "budget", state, serve_args(endpoint, *args_extra), env=env
            )
            serve.start()
            scrape = serve.wait_for(committed_all(40 * (r + 1)), 120, "a cycle over the events")
            gauge_max = max(gauge_max, scrape.value("ragpulse_judge_budget_spent_this_hour") or 0)
            serve.kill()
            serve.stop()
        paid = sum(tokens(c) for c in ok_calls(endpoint))
    same_hour = math.floor(time.time() / 3600) == hour
    return {
        "tokens paid / budget": paid / per_hour,
        "largest gauge / budget": gauge_max / per_hour,
        "within one clock hour": float(same_hour),
    }


def pace(
    code: Path,
    per_hour: int,
    rate: int,
    seconds: float,
    restart_every: float | None,
    start_second: float,
) -> dict[str, float]:
    """Tokens paid / budget with events arriving at `rate` a second for `seconds`, serve
    SIGKILLed and restarted every `restart_every` seconds (None: one process throughout).
    Every serve of the run shares one clock (libfaketime), which read `start_second` seconds
    into the hour before the real one when the run began: every run sees the same seconds left
    in its hour, which the budget's pace depends on, and none crosses an hour."""
    hour = math.floor(time.time() / 3600) - 1
    env = {**clock_at(hour * 3600 + start_second), "PYTHONPATH": str(code.resolve())}
    events = distinct_events(int(rate * seconds) + rate)
    args_extra = ("--judge-budget-per-hour", str(per_hour), "--judge-min-sample-rate", "0")
    processes = 0
    with tempfile.TemporaryDirectory() as tmp, ApacheKafkaBroker() as broker, FakeOpenAI(
        latency=0.02
    ) as endpoint:
        state = Path(tmp) / "state.sqlite"
        broker.create_topic("pace", 1)
        stop = threading.Event()

        def arrive() -> None:  # `rate` events each second, on the second
            for second, i in enumerate(range(0, len(events) - rate, rate)):
                if stop.wait(max(0.0, started + second - time.monotonic())):
                    return
                broker.produce("pace", events[i : i + rate], 0)

        started = time.monotonic()
        producer = threading.Thread(target=arrive, daemon=True)
        producer.start()
        try:
            while (launched := time.monotonic()) - started < seconds:
                serve = serve_class(code)(
                    broker.bootstrap, "pace", state, serve_args(endpoint, *args_extra), env=env
                )
                serve.start()
                processes += 1
                if restart_every is not None:
                    # Each process lives to commit its first cycle (the one a restart
                    # front-loads), however slow the machine is, and --restart-every at least.
                    serve.wait_for(
                        lambda m: m.total("ragpulse_cycles_total", outcome="ok") >= 1, 300,
                        "a first cycle",
                    )
                ends = min(started + seconds, launched + (restart_every or seconds))
                time.sleep(max(0.0, ends - time.monotonic()))
                serve.kill()
                serve.stop()
        finally:
            stop.set()
            producer.join()
        paid = sum(tokens(c) for c in ok_calls(endpoint))
    return {
        "tokens paid / budget": paid / per_hour,
        "serve processes": float(processes),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--code", action="append", type=Path, required=True,
                   help="a ragpulse source tree to run serve from (repeat to compare)")
    p.add_argument("--kills", type=int, default=12)
    p.add_argument("--events", type=int, default=240)
    p.add_argument("--restarts", type=int, default=10)
    p.add_argument("--budget", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--rate", type=int, default=5, help="pace: events a second")
    p.add_argument("--seconds", type=float, default=120.0, help="pace: how long events arrive")
    p.add_argument("--restart-every", type=float, default=12.0, help="pace: seconds")
    p.add_argument("--start-second", type=float, default=60.0,
                   help="pace: the second of a clock hour every run's serve clock starts at")
    p.add_argument("--scenarios", default="kills,budget",
                   help="which scenarios to run, comma-separated (default: kills,budget)")
    a = p.parse_args()
    scenarios = [x for x in ("kills", "budget", "pace") if x in a.scenarios.split(",")]
    results: dict[str, dict[str, dict[str, float]]] = collections.defaultdict(dict)
    if "pace" in scenarios:
        for kind, every in (("restarted", a.restart_every), ("one process", None)):
            for code in a.code:
                results[str(code)][f"pace, {kind}"] = pace(
                    code, a.budget, a.rate, a.seconds, every, a.start_second
                )
        scenarios = [s for s in scenarios if s != "pace"]
    for code in a.code:
        if "kills" in scenarios:
            results[str(code)]["kills"] = kills(code, a.events, a.kills, a.seed)
        if "budget" in scenarios:
            results[str(code)]["budget"] = budget(code, a.restarts, a.budget)
    scenarios += [k for k in next(iter(results.values())) if k.startswith("pace")]
    print(f"{a.kills} kills over {a.events} events x 2 judges; {a.restarts} restarts under a "
          f"budget of {a.budget} tokens/hour")
    for scenario in scenarios:
        keys = list(next(iter(results.values()))[scenario])
        print(f"\n{scenario:<28}" + "".join(f"{c!s:>22}" for c in results))
        for k in keys:
            print(f"  {k:<26}" + "".join(f"{results[c][scenario][k]:>22.3f}" for c in results))


if __name__ == "__main__":
    main()
