"""--judge-combine on a real small model: agreement with the separate judges, and prompt tokens.

For whoever changes `judges.llm.combined` or the prompts it combines. The three default LLM judges
(groundedness, relevance_to_query, safety) grade the same rows twice on the same server: each
judge in its own call, then all three in one combined call. Prints, per judge, how often the
two modes agree (and Cohen's kappa between them, on the rows both graded), each mode's agreement
with the human labels where the data has them (groundedness on RAGTruth QA, safety on the OpenAI
moderation set; both read from ../shared/eval-data/, never copied), and prompt tokens per row.

SmolLM2-135M-Instruct (llama.cpp's llama-server, the `llm-test` extra; tests/llama_server.py) is
far too small to be a good judge: its figures say what the combined prompt costs and whether it
changes the verdicts of the same model, not how well a production model grades.

    .venv/bin/python tests/bench/eval_combined_judges.py [--rows 30] [--moderation 30]
        [--base-url http://127.0.0.1:8080/v1 --model NAME]   # another server instead
    .venv/bin/python tests/bench/eval_combined_judges.py --stand-in --rows 200 --moderation 200

`--stand-in` answers from tests/fake_openai.py instead of a model, counting tokens as
tests/bench/bench_peers.py does: only the token table means anything then, and it takes
seconds where SmolLM2 on a busy 2-core machine takes minutes per call.

Rows are picked deterministically (ordered by a hash of their id), so reruns judge the same ones.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for llama_server
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/bench

from eval_llm_judges import agreement_line, endpoint_url, outcome_counts, pick_rows
from eval_local_judges import DEFAULT_DATA_DIR, cohen_kappa, load_rows, to_input
from llama_server import MissingLlamaServer

from ragpulse.judges import DEFAULT_JUDGES
from ragpulse.judges.base import JudgeInput, Verdict
from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.panel import JudgePanel


def judge_all(
    base_url: str, model: str, inputs: Sequence[JudgeInput], *, combine: bool, concurrency: int
) -> tuple[list[tuple[Verdict, ...]], float]:
    """Every input graded by the default judges, separately or combined; verdicts, seconds."""
    endpoint = OpenAIJudgeEndpoint(
        base_url=base_url,
        model=model,
        concurrency=concurrency,
        timeout_seconds=600.0,  # a long prompt on a busy CPU; a timeout would skew the figures
        max_retries=1,
    )
    panel = JudgePanel(build_llm_judges(DEFAULT_JUDGES, endpoint, combine=combine))
    try:
        started = time.perf_counter()
        rows = panel.judge_batch(inputs)
        return rows, time.perf_counter() - started
    finally:
        panel.close()


def mode_lines(
    label: str, separate: Sequence[tuple[Verdict, ...]], combined: Sequence[tuple[Verdict, ...]]
) -> list[str]:
    """Per judge: rows both modes graded, how often they agree, and kappa between them."""
    lines = []
    for j, name in enumerate(DEFAULT_JUDGES):
        both = [
            (s[j].rating == "yes", c[j].rating == "yes")
            for s, c in zip(separate, combined, strict=True)
            if "error" not in (s[j].rating, c[j].rating)
        ]
        if not both:
            lines.append(f"| {name} · {label} | 0 | | |")
            continue
        agree = sum(a == b for a, b in both) / len(both)
        first, second = [a for a, _ in both], [b for _, b in both]
        kappa = cohen_kappa(first, second) if len(set(first + second)) > 1 else float("nan")
        lines.append(f"| {name} · {label} | {len(both)} | {100 * agree:.0f} % | {kappa:.2f} |")
    return lines


def human_lines(
    label: str,
    truth: Sequence[bool],
    rows: Sequence[tuple[Verdict, ...]],
    judge: int,
) -> str:
    graded = [k for k, row in enumerate(rows) if row[judge].rating != "error"]
    return agreement_line(
        label, [truth[k] for k in graded], [rows[k][judge].rating == "yes" for k in graded]
    )


def tokens_per_row(rows: Sequence[tuple[Verdict, ...]]) -> tuple[float, float]:
    """Median prompt and completion tokens of one row, all judges together."""
    return (
        statistics.median(sum(v.prompt_tokens for v in row) for row in rows),
        statistics.median(sum(v.completion_tokens for v in row) for row in rows),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--rows", type=int, default=30, help="RAGTruth QA rows (default 30)")
    parser.add_argument("--moderation", type=int, default=30, help="moderation rows (default 30)")
    parser.add_argument("--base-url", default=None, help="use this server instead of starting one")
    parser.add_argument("--model", default=None, help="model name at --base-url")
    parser.add_argument("--concurrency", type=int, default=2, help="the server's slots")
    parser.add_argument("--stand-in", action="store_true", help="tokens only, no model")
    args = parser.parse_args(list(argv) if argv is not None else None)

    ragtruth = args.data_dir / "ragtruth.dev.jsonl"
    moderation = args.data_dir / "openai_moderation.dev.jsonl"
    if not ragtruth.is_file() or not moderation.is_file():
        print(f"eval data not found in {args.data_dir}; pass --data-dir", file=sys.stderr)
        return 2
    rag_rows = pick_rows(load_rows(ragtruth), "QA", args.rows)
    mod_rows = sorted(
        (r for r in load_rows(moderation) if r.get("label_pass") is not None),
        key=lambda r: zlib.crc32(str(r["id"]).encode()),
    )[: args.moderation]
    sets = {
        "RAGTruth QA": ([to_input(r) for r in rag_rows], [bool(r["label_pass"]) for r in rag_rows]),
        "moderation": ([to_input(r) for r in mod_rows], [bool(r["label_pass"]) for r in mod_rows]),
    }
    results: dict[tuple[str, bool], tuple[list[tuple[Verdict, ...]], float]] = {}
    from bench_peers import approx_tokens
    from fake_openai import FakeOpenAI

    server: contextlib.AbstractContextManager[FakeOpenAI | None] = contextlib.nullcontext()
    if args.stand_in:
        server = FakeOpenAI(count_tokens=approx_tokens)
        args.concurrency = 32
    try:
        with server as fake, endpoint_url(
            fake.base_url if fake else args.base_url, "stand-in" if fake else args.model
        ) as (base_url, model):
            for name, (inputs, _) in sets.items():
                for combine in (False, True):
                    print(f"judging {len(inputs)} {name} rows, combine={combine}", flush=True)
                    results[name, combine] = judge_all(
                        base_url, model, inputs, combine=combine, concurrency=args.concurrency
                    )
    except MissingLlamaServer as exc:
        print(exc, file=sys.stderr)
        return 2

    print(f"\nModel {model}; outcomes:")
    for (name, combine), (rows, seconds) in results.items():
        mode = "combined" if combine else "separate"
        print(f"- {name}, {mode}: {seconds:.0f} s, {outcome_counts(rows)}")
    print("\nThe two modes against each other (rows both graded):\n")
    print("| judge · rows | n | same verdict | Cohen's kappa |")
    print("|---|---|---|---|")
    for name in sets:
        print("\n".join(mode_lines(name, results[name, False][0], results[name, True][0])))
    print("\nEach mode against the human labels:\n")
    print("| judge · mode | n | balanced accuracy | Cohen's kappa |")
    print("|---|---|---|---|")
    for combine in (False, True):
        mode = "combined" if combine else "separate"
        rag_truth, mod_truth = sets["RAGTruth QA"][1], sets["moderation"][1]
        rag, mod = results["RAGTruth QA", combine][0], results["moderation", combine][0]
        grounded, safety = DEFAULT_JUDGES.index("groundedness"), DEFAULT_JUDGES.index("safety")
        print(human_lines(f"groundedness · {mode}", rag_truth, rag, grounded))
        print(human_lines(f"safety · {mode}", mod_truth, mod, safety))
    print("\nPrompt and completion tokens per row, the three judges together (median):\n")
    print("| rows | prompt, separate | prompt, combined | completion, separate | completion, "
          "combined |")
    print("|---|---|---|---|---|")
    for name in sets:
        sep, comb = tokens_per_row(results[name, False][0]), tokens_per_row(results[name, True][0])
        print(f"| {name} | {sep[0]:.0f} | {comb[0]:.0f} | {sep[1]:.0f} | {comb[1]:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
