"""The path of one record through `ragpulse serve`, measured: the files of pipeline/ and judges/
whose functions run, in order, from the cycle that reads the record to the scrape that exports
its `ragpulse_judge_verdicts_total`, and how often each file is entered again after the path
left it.

For whoever changes the layout (ARCHITECTURE.md quotes its output). It starts Apache Kafka
(jars from the tools cache), produces one record (a ragpulse event, or with --input-format
otlp_json one OTLP trace as the Collector's Kafka exporter writes it), and runs `ragpulse serve
--judge-backend local` in a child process whose every Python call into pipeline/ or judges/ is
recorded (`sys.setprofile` on every thread). The path is the serving threads' calls from the
first `run_cycle` to the return of the `apply_cycle` that saved the verdict, then the calls of
the first scrape after it (the metrics thread's `collect`). Consecutive calls in one file are one
visit; a file visited again later is a re-entry.

    RAGPULSE_CACHE=/var/cache/ragpulse .venv/bin/python tests/bench/trace_path.py
    RAGPULSE_CACHE=/var/cache/ragpulse .venv/bin/python tests/bench/trace_path.py \
        --input-format otlp_json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the broker and spans

from kafka_broker import ApacheKafkaBroker, produce
from otlp_spans import openinference_trace, otlp_json
from processes import free_port, health_port_args

REPO = Path(__file__).resolve().parents[2]

# Runs in the child: records (thread, file, function, event) for every call and return of a
# function defined under pipeline/ or judges/, then runs the CLI; writes the record at exit.
CHILD = r"""
import atexit, json, os, sys, threading
roots = [os.path.realpath(p) + os.sep for p in sys.argv[1:3]]
out = sys.argv[3]
seen, events = {}, []
def where(filename):
    rel = seen.get(filename)
    if rel is None:
        real = os.path.realpath(filename)
        rel = ""
        for root in roots:
            if real.startswith(root):
                rel = os.path.basename(root.rstrip(os.sep)) + "/" + real[len(root):]
        seen[filename] = rel
    return rel
def profile(frame, event, arg):
    if event not in ("call", "return"):
        return
    rel = where(frame.f_code.co_filename)
    if rel:
        events.append((threading.get_ident(), rel, frame.f_code.co_name, event))
def dump():
    sys.setprofile(None)
    threading.setprofile(None)
    with open(out, "w") as f:
        json.dump(events, f)
atexit.register(dump)
threading.setprofile(profile)
sys.setprofile(profile)
if os.path.exists(os.path.join("ragpulse", "__init__.py")):  # the cwd is the checkout
    from ragpulse.pipeline.cli import main
else:  # a checkout from before the ragpulse.* layout
    from pipeline.cli import main
sys.exit(main(sys.argv[4:]))
"""


def record_value(input_format: str) -> bytes:
    if input_format == "otlp_json":
        return otlp_json(openinference_trace())
    line = (REPO / "deploy" / "samples" / "events.jsonl").read_bytes().splitlines()[0]
    event = json.loads(line)
    event["timestamp"] = int((time.time() - 30) * 1000)  # epoch ms: a current event
    return json.dumps(event).encode()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def total(text: str, name: str) -> float:
    """The sum of a metric's samples in a /metrics text."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    )


def run_traced(code: Path, input_format: str, workdir: Path) -> list[tuple[int, str, str, str]]:
    out = workdir / "calls.json"
    port = free_port()
    with ApacheKafkaBroker() as broker:
        broker.create_topic("events", 1)
        argv = [
            "serve", "--kafka-bootstrap", broker.bootstrap, "--topic", "events",
            "--state", str(workdir / "state.sqlite"), "--metrics-host", "127.0.0.1",
            "--metrics-port", str(port), *health_port_args(code),
            "--judge-backend", "local", "--sample-rate", "1",
            "--trigger-interval", "1s", "--input-format", input_format,
        ]
        log = (workdir / "serve.log").open("wb")
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(code / "pipeline"), str(code / "judges"),
             str(out), *argv],
            cwd=code, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            # One idle cycle first, so the record's path is a running serve's, not start-up's.
            wait_for(lambda text: total(text, "ragpulse_cycles_total") > 0,
                     port, child, workdir)
            produce(broker.bootstrap, "events", [record_value(input_format)])
            wait_for(lambda text: total(text, "ragpulse_judge_verdicts_total") > 0,
                     port, child, workdir)
        finally:
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=120)
            log.close()
    return [tuple(e) for e in json.loads(out.read_text())]


def wait_for(
    done: Callable[[str], bool], port: int, child: subprocess.Popen[bytes], workdir: Path
) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError((workdir / "serve.log").read_text()[-4000:])
        with contextlib.suppress(OSError):
            if done(scrape(port)):
                return
        time.sleep(1.0)
    raise RuntimeError(
        "serve did not get there in 300 s; its log:\n" + (workdir / "serve.log").read_text()[-4000:]
    )


def path_of(events: list[tuple[int, str, str, str]]) -> list[str]:
    """The files on the record's path (see the module docstring), one entry per visit."""
    # Each scrape runs on a thread of its own (ThreadingHTTPServer): not the record's path.
    first_file: dict[int, str] = {}
    for thread, f, _, _ in events:
        first_file.setdefault(thread, f)
    scrapes = {t for t, f in first_file.items()
               if f.endswith(("metrics/http.py", "sinks/prometheus_http.py"))}  # new, old layout
    # The first element a stage processes is the record (the cycles before it read nothing).
    judged = next(i for i, (_, f, fn, _) in enumerate(events)
                  if f.startswith("pipeline/stages") and fn == "process")
    start = max(i for i, (t, _, fn, ev) in enumerate(events[:judged])
                if fn == "run_cycle" and ev == "call")
    saved = next(i for i in range(judged, len(events))
                 if events[i][2] == "apply_cycle" and events[i][3] == "return")
    calls = [f for t, f, _, ev in events[start:saved + 1] if ev == "call" and t not in scrapes]
    scrape = next(i for i in range(saved, len(events))
                  if events[i][0] in scrapes and events[i][2] == "collect")
    thread = events[scrape][0]
    for t, f, fn, ev in events[scrape:]:
        if t != thread:
            continue
        if ev == "call":
            calls.append(f)
        elif fn == "collect":
            break
    return [f for k, f in enumerate(calls) if k == 0 or calls[k - 1] != f]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--input-format", choices=("ragpulse", "otlp_json"), default="ragpulse")
    parser.add_argument("--code", type=Path, default=REPO, metavar="DIR",
                        help="the checkout to trace (default: this one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        visits = path_of(run_traced(args.code.resolve(), args.input_format, Path(tmp)))
    entries = collections.Counter(visits)
    order = list(dict.fromkeys(visits))
    print(f"### One {args.input_format} record to ragpulse_judge_verdicts_total "
          f"({args.code.resolve()})\n")
    print(f"{len(order)} files, {len(visits)} visits, "
          f"{len(visits) - len(order)} re-entries\n")
    print("| # | file | visits |")
    print("|---|---|---|")
    for n, f in enumerate(order, 1):
        print(f"| {n} | {f} | {entries[f]} |")
    print("\nvisits in order: " + " -> ".join(visits))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
