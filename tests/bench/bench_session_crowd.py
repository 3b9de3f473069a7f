"""`ragpulse serve` with a crowd of open conversations (issue 31), checkouts side by side.

For whoever sizes serve with --session-judges, or checks that a change to
pipeline/service/conversations.py keeps a cycle's work in proportion to what arrives. For each
--code DIR (a checkout, run as `python -m ragpulse.pipeline.cli` in DIR, which puts it first on
the module path), taken in
turn, on one Apache Kafka broker (tests/kafka_broker.py), all on 127.0.0.1:

1. a state file holding --open open conversations of --turns turns each: rows written straight
   into its `session_turns` table (the layout every version since conversations reads), their
   last turns spread over the half hour before now; --session-gap 1h, so that none falls due
   during the run and every cycle carries the whole crowd;
2. `ragpulse serve --session-judges user_frustration --judge-backend local` on a topic of its
   own while a producer sends --rate turns a second (each a turn of one of the open
   conversations or of a new one) for --duration seconds;
3. meanwhile /healthz probed every second (200, 503, or no answer within 2 s), serve's resident
   memory read every second (VmRSS; VmHWM, its peak, at the end), and the cycles from /metrics
   (ragpulse_cycle_duration_seconds: count and mean; the longest stretch without a completed
   cycle, from the heartbeat gauge);
4. then SIGTERM, and the seconds until serve exits (SIGKILL after --stop-timeout).

Prints one markdown table row per checkout. --unhealthy-after is 60 s here (the default is 5m)
so that a run of a few minutes shows whether cycles outlast it.

    .venv/bin/python tests/bench/bench_session_crowd.py --code /tmp/before --code . \\
        [--open 100000] [--turns 4] [--rate 20] [--duration 240]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from kafka import KafkaProducer
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for the helpers

from kafka_broker import ApacheKafkaBroker
from processes import free_port

GAP_S = 3600.0
QUESTION = "How do I export the quarterly report as a spreadsheet?"
ANSWER = "Open the report, choose Export, then Spreadsheet; the file keeps your filters."


def event(session: int, i: int, t: float) -> dict[str, object]:
    return {
        "request_id": f"s{session}-{i}", "timestamp": round(t * 1000), "app": "help-bot",
        "model": "m1", "request": f"{QUESTION} ({i})", "response": ANSWER,
        "session_id": f"s{session}",
    }


def crowd_state(
    path: Path, code: Path, topic: str, sessions: int, turns: int, now: float
) -> None:
    """A state file of `code`'s own layout (its StateStore creates it) with `sessions` open
    conversations of `turns` turns in `session_turns`."""
    subprocess.run(
        [sys.executable, "-c",
         "import sys; from ragpulse.pipeline.service.state import StateStore; "
         "StateStore(sys.argv[1]).close()", str(path)],
        env={**os.environ, "PYTHONPATH": str(code)}, cwd=code, check=True, capture_output=True,
    )
    rows = []
    for s in range(sessions):
        last = now - 1800.0 + 1800.0 * s / sessions
        for i in range(turns):
            t = last - (turns - 1 - i) * 20.0
            e = event(s, i, t)
            text = orjson.dumps([e["request_id"], t, e["request"], e["response"], None])
            rows.append((topic, "help-bot", f"s{s}", e["request_id"], t, "m1",
                         len(str(e["request"]).encode()) + len(ANSWER.encode()), None, text))
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executemany(
            "INSERT INTO session_turns (topic, app, session_id, request_id, event_time, model, "
            "size, judged, turn) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        db.commit()


@dataclass
class Probe:
    """What one run saw."""

    start_s: float = 0.0
    health: dict[str, int] = field(default_factory=lambda: {"200": 0, "503": 0, "none": 0})
    rss_mib: list[float] = field(default_factory=list)
    peak_mib: float = 0.0
    cycles: int = 0
    cycle_mean_s: float | None = None
    longest_without_cycle_s: float = 0.0
    stop_s: float | None = None
    exit_code: int | None = None
    turns_sent: int = 0


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("ragpulse_cycle_duration_seconds_count",
                               "ragpulse_cycle_duration_seconds_sum",
                               "ragpulse_heartbeat_timestamp_seconds",
                               "ragpulse_sessions_open"):
                out[sample.name] = sample.value
    return out


def vm(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(code: Path, broker: ApacheKafkaBroker, args: argparse.Namespace, folder: Path) -> Probe:
    probe = Probe()
    topic = f"crowd-{int(time.time())}"
    broker.create_topic(topic, 1)
    now = time.time()
    state = folder / f"{topic}.sqlite"
    crowd_state(state, code, topic, args.open, args.turns, now)
    port = free_port()
    log = (folder / f"{topic}.log").open("wb")
    command = [
        sys.executable, "-m", "ragpulse.pipeline.cli", "serve", "--kafka-bootstrap",
        broker.bootstrap, "--topic", topic, "--state", str(state), "--metrics-port", str(port),
        "--judge-backend", "local", "--judges", "relevance_to_query",
        "--session-judges", "user_frustration", "--session-gap", "1h",
        "--trigger-interval", "1s", "--partition-idle-after", "2s", "--kafka-timeout", "5s",
        "--unhealthy-after", "60s", "--group-id", topic,
    ]
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    serve = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONPATH": str(code)}, cwd=code,
                             start_new_session=True)
    while True:
        try:
            scrape(url)
            break
        except OSError:
            if serve.poll() is not None:
                raise RuntimeError(f"serve of {code} exited {serve.returncode}") from None
            time.sleep(0.2)
    probe.start_s = time.monotonic() - started
    stop = threading.Event()

    def produce() -> None:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20)
        rnd = random.Random(7)
        n = 0
        while not stop.is_set():
            t = time.time()
            for _ in range(args.rate):
                s = rnd.randrange(args.open + 1000)  # mostly turns of the crowd; some new ones
                producer.send(topic, orjson.dumps(event(s, 100 + n, t)))
                n += 1
            producer.flush()
            stop.wait(1.0)
        probe.turns_sent = n
        producer.close()

    sender = threading.Thread(target=produce, daemon=True)
    sender.start()
    end = time.monotonic() + args.duration
    last_cycle_at = time.monotonic()
    last_beat: float | None = None
    while time.monotonic() < end:
        tick = time.monotonic()
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as reply:
                probe.health[str(reply.status)] = probe.health.get(str(reply.status), 0) + 1
        except urllib.error.HTTPError as exc:
            probe.health[str(exc.code)] = probe.health.get(str(exc.code), 0) + 1
        except OSError:
            probe.health["none"] += 1
        with contextlib.suppress(OSError):
            m = scrape(url)
            beat = m.get("ragpulse_heartbeat_timestamp_seconds")
            if beat is not None and beat != last_beat:
                last_beat, last_cycle_at = beat, time.monotonic()
            probe.cycles = int(m.get("ragpulse_cycle_duration_seconds_count", 0))
            if probe.cycles:
                probe.cycle_mean_s = m["ragpulse_cycle_duration_seconds_sum"] / probe.cycles
        probe.longest_without_cycle_s = max(probe.longest_without_cycle_s,
                                            time.monotonic() - last_cycle_at)
        with contextlib.suppress(OSError):
            probe.rss_mib.append(vm(serve.pid, "VmRSS"))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    with contextlib.suppress(OSError):
        probe.peak_mib = vm(serve.pid, "VmHWM")
    stop.set()
    sender.join()
    t0 = time.monotonic()
    serve.send_signal(signal.SIGTERM)
    try:
        probe.exit_code = serve.wait(timeout=args.stop_timeout)
        probe.stop_s = time.monotonic() - t0
    except subprocess.TimeoutExpired:
        os.killpg(serve.pid, signal.SIGKILL)
        serve.wait()
    log.close()
    return probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", action="append", type=Path, required=True, metavar="DIR")
    parser.add_argument("--open", type=int, default=100_000)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rate", type=int, default=20, help="turns a second (default 20)")
    parser.add_argument("--duration", type=float, default=240.0)
    parser.add_argument("--stop-timeout", type=float, default=120.0)
    args = parser.parse_args()
    results = []
    with ApacheKafkaBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        for code in args.code:
            results.append((code, run(code.resolve(), broker, args, Path(tmp))))
            print(f"done: {code}", file=sys.stderr, flush=True)
    print(f"\n{args.open} open conversations of {args.turns} turns, {args.rate} turns/s for "
          f"{args.duration:.0f} s, --unhealthy-after 60s\n")
    print("| checkout | start-up s | cycles | mean cycle s | longest without a cycle s | "
          "median / peak RSS MiB | /healthz 200 / 503 / none | SIGTERM to exit s (code) |")
    print("|---|---|---|---|---|---|---|---|")
    for code, p in results:
        mean = f"{p.cycle_mean_s:.1f}" if p.cycle_mean_s is not None else "-"
        stop = (f"{p.stop_s:.1f} ({p.exit_code})" if p.stop_s is not None
                else f"> {args.stop_timeout:.0f} (killed)")
        rss = f"{statistics.median(p.rss_mib):.0f} / {p.peak_mib:.0f}" if p.rss_mib else "-"
        print(f"| {code} | {p.start_s:.1f} | {p.cycles} | {mean} | "
              f"{p.longest_without_cycle_s:.0f} | {rss} | {p.health.get('200', 0)} / "
              f"{p.health.get('503', 0)} / {p.health['none']} | {stop} |")


if __name__ == "__main__":
    main()
