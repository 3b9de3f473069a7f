"""Throughput of the batch pipeline with the local judges, stage by stage, side by side.

For whoever sizes or tunes `ragpulse serve`, which runs `pipeline.graphs.bounded.run_graph` once per
micro-batch. Generates N realistic events (2 apps, 2 models, a chat question, 3 retrieved chunks
of ~400 characters, an answer of ~300 characters) into a temporary file, then measures in one
process, R times each, interleaved so drift hits every stage alike:

    parse         `parse_event` on every line
    judges        `JudgePanel.judge_batch` with the three local judges, in batches of 256
    judges_safety the same with the safety judge alone (to split (d) below)
    run_file      `pipeline.commands.run.run_file` with the three local judges (the whole
                  Beam pipeline)
    run_safety    `run_file` with only the safety judge (isolates the Beam and I/O overhead)

and prints medians, events/s and the share of `run_file` spent per stage as a markdown table.
Caches of the judges (chunk analyses, stems) are warmed by one untimed pass first: `serve` is a
long-lived process, so the steady state is what it sees.

    .venv/bin/python tests/bench/bench_pipeline.py [--events N] [--repeats R] [--seed S]
        [--chunk-pool K]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

from ragpulse.judges import JudgeSpec
from ragpulse.judges.base import JudgeInput
from ragpulse.pipeline.commands.run import run_file
from ragpulse.pipeline.formats.events import parse_event
from ragpulse.pipeline.settings.models import JudgeSettings, RunSettings

T0_MS = 1_763_632_800_000  # 2025-11-20T10:00:00Z
APPS = ("help-bot", "sales-bot")
MODELS = ("gpt-4o-mini-2024-07-18", "llama-3.1-8b")
JUDGE_BATCH = 256

# A small domain vocabulary, so that stems, stopwords, numbers and names occur as in real logs.
_NOUNS = (
    "refund", "policy", "order", "invoice", "account", "password", "router", "firmware",
    "warranty", "shipment", "carrier", "subscription", "plan", "discount", "coupon", "payment",
    "card", "balance", "statement", "branch", "office", "manager", "device", "battery",
    "charger", "screen", "keyboard", "printer", "driver", "update", "release", "version",
    "feature", "customer", "support", "ticket", "request", "delivery", "address", "country",
    "region", "tax", "fee", "price", "limit", "contract", "renewal", "cancellation", "period",
    "notice", "document", "form", "signature", "agreement", "employee", "schedule", "holiday",
    "weekend", "storage", "backup", "server", "database", "network", "cable", "adapter",
    "license",
)
_VERBS = (
    "accepts", "requires", "includes", "covers", "supports", "allows", "replaces", "extends",
    "reduces", "charges", "ships", "processes", "confirms", "updates", "protects", "renews",
    "cancels", "delivers", "stores", "restores", "connects",
)
_ADJECTIVES = (
    "standard", "premium", "annual", "monthly", "digital", "international", "local", "secure",
    "wireless", "optional", "free", "additional", "previous", "current", "new", "original",
    "regional", "certified",
)
_NAMES = ("Acme", "Globex", "Initech", "Zurich", "Berlin", "Umbrella", "Contoso", "Madrid")
_QUESTION_FRAMES = (
    "How many days does the {a} {n} take?",
    "What is the {a} {n} for my {n2}?",
    "Can you explain how the {n} {v} the {n2}?",
    "Does the {a} {n} cover a {n2} bought in {name}?",
    "Which {n} do I need for the {a} {n2}?",
)


def _sentence(rng: random.Random) -> str:
    subject = f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
    if rng.random() < 0.3:
        subject = f"{rng.choice(_NAMES)}'s {rng.choice(_NOUNS)}"
    obj = f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} and the {rng.choice(_NOUNS)}"
    tail = rng.choice(
        (
            f" within {rng.randint(2, 90)} days",
            f" for {rng.randint(5, 500)} euros",
            f" at the {rng.choice(_NAMES)} {rng.choice(_NOUNS)}",
            " for every customer",
            "",
        )
    )
    return f"{subject} {rng.choice(_VERBS)} the {obj}{tail}."


def _text(rng: random.Random, chars: int) -> str:
    parts: list[str] = []
    size = 0
    while size < chars:
        s = _sentence(rng)
        parts.append(s)
        size += len(s) + 1
    return " ".join(parts)


def synthetic_events(n: int, *, seed: int = 7, chunk_pool: int = 8000) -> list[bytes]:
    """N JSON events in the inference-log format, deterministic for a seed.

    Chunks come from a pool with a skewed popularity (popular documents recur, as in a real
    knowledge base), larger than the judges' 4096-entry chunk cache; answers reuse sentences of
    their chunks most of the time, so both ratings occur.
    """
    rng = random.Random(seed)
    pool = [_text(rng, 400) for _ in range(chunk_pool)]
    events = []
    for i in range(n):
        picks = [int(chunk_pool * rng.random() ** 2) for _ in range(3)]
        chunks = [pool[k] for k in picks]
        question = rng.choice(_QUESTION_FRAMES).format(
            a=rng.choice(_ADJECTIVES), n=rng.choice(_NOUNS), n2=rng.choice(_NOUNS),
            v=rng.choice(_VERBS), name=rng.choice(_NAMES),
        )
        grounded = [s + "." for c in chunks for s in c.split(". ") if not s.endswith(".")]
        answer_parts: list[str] = []
        while sum(len(p) + 1 for p in answer_parts) < 300:
            if rng.random() < 0.8 and grounded:
                answer_parts.append(rng.choice(grounded))
            else:
                answer_parts.append(_sentence(rng))
        events.append(
            orjson.dumps(
                {
                    "request_id": f"req-{seed}-{i}",
                    "timestamp": T0_MS + i * 20,  # 50 events/s of event time
                    "app": APPS[i % 2],
                    "model": MODELS[(i // 2) % 2],
                    "request": {
                        "messages": [
                            {"role": "system", "content": "You answer from the documents."},
                            {"role": "user", "content": question},
                        ]
                    },
                    "response": " ".join(answer_parts),
                    "retrieved_context": [
                        {"content": pool[k], "doc_uri": f"kb/{k}"} for k in picks
                    ],
                }
            )
        )
    return events


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for one call of `fn`."""
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def _judge_all(spec: JudgeSpec, items: Sequence[JudgeInput]) -> None:
    panel = spec.build()
    try:
        for i in range(0, len(items), JUDGE_BATCH):
            panel.judge_batch(items[i : i + JUDGE_BATCH])
    finally:
        panel.close()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--events", type=int, default=20_000, help="events per run (default 20000)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per stage (default 3)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--chunk-pool", type=int, default=8000,
        help="distinct retrieved chunks (default 8000, above the judges' 4096-entry chunk cache)",
    )
    args = ap.parse_args(argv)
    n = args.events
    load = os.getloadavg()

    lines = synthetic_events(n, seed=args.seed, chunk_pool=args.chunk_pool)
    all_judges = JudgeSettings(backend="local").spec()
    safety_only = JudgeSettings(backend="local", names=("safety",)).spec()
    with tempfile.TemporaryDirectory(prefix="ragpulse-bench-") as tmp:
        src = Path(tmp) / "events.jsonl"
        src.write_bytes(b"\n".join(lines) + b"\n")
        items = [parse_event(raw).judge_input for raw in lines]
        _judge_all(all_judges, items)  # warm the judges' caches (steady state of `serve`)

        def run(spec: JudgeSpec) -> Callable[[], object]:
            judges = JudgeSettings(backend="local", names=spec.names)
            settings = RunSettings(input=src, output=Path(tmp) / "out", judges=judges)
            return lambda: run_file(settings)

        stages: dict[str, Callable[[], object]] = {
            "parse": lambda: [parse_event(raw) for raw in lines],
            "judges": lambda: _judge_all(all_judges, items),
            "judges_safety": lambda: _judge_all(safety_only, items),
            "run_file": run(all_judges),
            "run_safety": run(safety_only),
        }
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in stages}
        for r in range(args.repeats):
            for name, fn in stages.items():
                times[name].append(_timed(fn))
            print(f"repeat {r + 1}/{args.repeats}: "
                  + ", ".join(f"{k} {v[-1][0]:.2f}s" for k, v in times.items()), file=sys.stderr)

    print(f"\nN = {n} events, R = {args.repeats} repeats, medians; "
          f"chunk pool {args.chunk_pool}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average before {load[0]:.2f}\n")
    print(_table(n, times))
    return 0


def _table(n: int, times: dict[str, list[tuple[float, float]]]) -> str:
    """The markdown table: wall and CPU medians, events/s, share of `run_file` per stage.

    CPU seconds (of this process; Beam's FnApiRunner runs its worker in-process) are quoted
    next to wall seconds because they are less disturbed by other load on the machine.
    """
    wall = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    rows = [
        ("(a) parse_event", "parse"),
        ("(b) local judge panel (3 judges, batches of 256)", "judges"),
        ("(b') local judge panel (safety only)", "judges_safety"),
        ("(c) run_file, 3 local judges", "run_file"),
        ("(d) run_file, safety only", "run_safety"),
    ]
    out = [
        "| stage | wall s | CPU s | events/s (wall) | events/CPU-s | share of (c), CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, k in rows:
        out.append(f"| {label} | {wall[k]:.2f} | {cpu[k]:.2f} | {n / wall[k]:,.0f} | "
                   f"{n / cpu[k]:,.0f} | {cpu[k] / cpu['run_file']:.0%} |")
    beam_c = {d: m["run_file"] - m["parse"] - m["judges"] for d, m in (("w", wall), ("c", cpu))}
    beam_d = {
        d: m["run_safety"] - m["parse"] - m["judges_safety"] for d, m in (("w", wall), ("c", cpu))
    }
    out.append(f"| Beam + I/O in (c) = (c) - (a) - (b) | {beam_c['w']:.2f} | {beam_c['c']:.2f} "
               f"| - | - | {beam_c['c'] / cpu['run_file']:.0%} |")
    out.append(f"| Beam + I/O in (d) = (d) - (a) - (b') | {beam_d['w']:.2f} | {beam_d['c']:.2f} "
               f"| - | - | - |")
    return "\n".join(out)


    return 0


if __name__ == "__main__":
    raise SystemExit(main())
