"""Benchmark: ragpulse's LLM judges side by side with the same judges in peer libraries.

One run, one stand-in server, the same records for every contestant. The stand-in
(tests/fake_openai.py) answers every chat call after a fixed latency (300 ms), counts requests
and tokens, and answers each contestant's prompt in the format that contestant's parser expects
(a router keyed on the prompt: ragpulse's verdict JSON or its combined object, Phoenix's
structured-output schema, MLflow's `score:` / `justification:` lines, Ragas's JSON schemas;
`/v1/embeddings` for Ragas's answer relevancy). Tokens are counted by one approximation for
everyone (`approx_tokens`: the pieces of cl100k's pre-tokenizer split, words, digit runs of up
to three and punctuation runs; the BPE files of tiktoken cannot be downloaded here), so the
token columns compare contestants, not bills.

The records: 200 synthetic RAG records (a question, three chunks of about 120 words, an answer
of about 65 words; every fourth answer states an altered fact). Two judge sets: groundedness
alone, and the three default judges (groundedness, relevance_to_query, safety) or the peer's
nearest ones (named in the table). Each contestant runs in a subprocess: ragpulse and the bare
`AsyncOpenAI` loop with this project's interpreter, the peers with their own virtual
environment (`--peers-venv`, created and filled from PyPI on first use: arize-phoenix-evals,
mlflow, ragas, at their latest releases), never this project's. Each peer runs at its default
concurrency and at 32 (Phoenix at 32 also with its adaptive rate limiter opened up).

    .venv/bin/python tests/bench/bench_peers.py                      # everything, once
    .venv/bin/python tests/bench/bench_peers.py --repeats 3          # medians of 3
    .venv/bin/python tests/bench/bench_peers.py --only ragpulse,bare # no peer venv needed

Columns: wall seconds, records/s, HTTP calls per record, prompt and completion tokens per
record, and parse failures (verdicts or scores the contestant could not read from the reply).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
PEER_PACKAGES = ("arize-phoenix-evals", "mlflow", "ragas", "langchain-openai", "pandas", "pytest")
# ragas 0.4.3 imports langchain_community.chat_models.vertexai, which langchain-community 0.4
# removed; the 0.3 line of langchain is the one it runs with.
PEER_CONSTRAINTS = ("langchain-community<0.4", "langchain-openai<1")
DEFAULT_PEERS_VENV = Path(tempfile.gettempdir()) / "ragpulse-peers" / "venv"
MODEL = "gpt-4o-mini"

# -- the records (deterministic) ----------------------------------------------------------------

_PRODUCTS = ["Nimbus", "Quarry", "Larkspur", "Tessel", "Orbit", "Cobalt", "Fennel", "Juniper"]
_FEATURES = [
    ("backups", "kept", "days"),
    ("exports", "limited to", "rows"),
    ("sessions", "closed after", "minutes"),
    ("invoices", "archived after", "months"),
    ("uploads", "capped at", "megabytes"),
    ("API keys", "rotated every", "days"),
]
_FILLER = [
    "Administrators can change this setting from the workspace console at any time.",
    "The change applies to every member of the workspace on their next sign-in.",
    "Audit logs record who changed the setting and when the change took effect.",
    "Customers on the enterprise plan can ask support to review the configuration.",
    "The documentation lists the defaults for each region in a separate table.",
    "Older workspaces keep the values they had until an administrator updates them.",
    "A notification is sent to the owners of the workspace when the limit is reached.",
    "The mobile apps follow the same rules as the web application in every region.",
]


def _chunk(rng: random.Random, product: str, fact: str) -> str:
    sentences = [fact]
    while sum(len(s.split()) for s in sentences) < 118:
        sentences.append(rng.choice(_FILLER).replace("the workspace", f"the {product} workspace"))
    return " ".join(sentences)


def make_records(count: int = 200, seed: int = 7) -> list[dict[str, Any]]:
    """`count` records: question, three chunks (~120 words), answer (~65 words), and whether
    the answer alters a fact (every fourth)."""
    rng = random.Random(seed)
    records = []
    for i in range(count):
        product = f"{rng.choice(_PRODUCTS)} {i}"
        facts = []
        for thing, verb, unit in rng.sample(_FEATURES, 3):
            facts.append((thing, verb, rng.randint(2, 90), unit))
        chunks = [
            _chunk(rng, product, f"In {product}, {t} are {v} {n} {u}.") for t, v, n, u in facts
        ]
        thing, verb, number, unit = facts[0]
        altered = i % 4 == 3
        stated = number + rng.randint(5, 40) if altered else number
        other = facts[1]
        answer = (
            f"In {product}, {thing} are {verb} {stated} {unit}, as the documentation states. "
            f"Also, {other[0]} are {other[1]} {other[2]} {other[3]}. Administrators can change "
            "these settings from the workspace console, and the change applies to every member "
            "on their next sign-in. Audit logs record who changed a setting and when it took "
            "effect, so you can always check the history of the configuration."
        )
        records.append(
            {
                "question": f"In {product}, how are {thing} handled?",
                "chunks": chunks,
                "answer": answer,
                "altered": altered,
            }
        )
    return records


# -- tokens and the reply router (in the stand-in's process) -------------------------------------

_PIECES = re.compile(r"[A-Za-z]+|\d{1,3}|[^\sA-Za-z\d]+")


def approx_tokens(text: str) -> int:
    """Tokens as cl100k's pre-tokenizer splits text (one per word, digit run of up to three,
    punctuation run): close to tiktoken's count for English prose, a little under it."""
    return len(_PIECES.findall(text))


def _instance(schema: dict[str, Any], defs: dict[str, Any], decision: str) -> Any:
    """A value conforming to a JSON schema (enough of it for the peers' reply models)."""
    if "$ref" in schema:
        return _instance(defs[schema["$ref"].split("/")[-1]], defs, decision)
    if "anyOf" in schema:
        return _instance(schema["anyOf"][0], defs, decision)
    if "enum" in schema:
        values = schema["enum"]
        return decision if decision in values else values[0]
    kind = schema.get("type")
    if kind == "object":
        return {k: _instance(v, defs, decision) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        return [_instance(schema.get("items", {}), defs, decision)]
    if kind == "integer":
        return 1
    if kind == "number":
        return 1.0
    if kind == "boolean":
        return True
    return "The statement is supported by the context."


def _system_and_user(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in body.get("messages") or [])


_RAGAS_SCHEMA = re.compile(
    r"complies with the following schema as specified in JSON Schema:\n(\{.*?\})(?:\n|Do not)",
    re.DOTALL,
)


def route(body: dict[str, Any]) -> str | None:
    """The reply a peer's parser expects, by the shape of its request; None for ragpulse's
    prompts (the stand-in's own verdict JSON, per judge for a combined call)."""
    text = _system_and_user(body)
    response_format = body.get("response_format") or {}
    structured = response_format.get("json_schema") or {}
    if structured.get("name") == "extract_structured_data":  # Phoenix's structured output
        schema = structured["schema"]
        return json.dumps(_instance(schema, schema.get("$defs", {}), ""))
    if "\nscore: " in text and "\njustification: " in text:  # MLflow genai metrics
        return "score: 5\njustification: The output is consistent with the provided context."
    match = _RAGAS_SCHEMA.search(text)
    if match:  # Ragas: the output model's schema is in the prompt
        try:
            schema = json.loads(match.group(1))
        except ValueError:
            return "{}"
        return json.dumps(_instance(schema, schema.get("$defs", {}), "1"))
    return None


# -- contestants (each in its own subprocess) -----------------------------------------------------


def _ragpulse_inputs(records: list[dict[str, Any]]) -> list[Any]:
    from ragpulse.judges.base import Chunk, JudgeInput

    return [
        JudgeInput(r["question"], r["answer"], tuple(Chunk(c) for c in r["chunks"]))
        for r in records
    ]


def run_ragpulse(
    records: list[dict[str, Any]], url: str, concurrency: int, judges: list[str], mode: str
) -> dict[str, Any]:
    from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
    from ragpulse.judges.llm.build import build_llm_judges
    from ragpulse.judges.panel import JudgePanel

    endpoint = OpenAIJudgeEndpoint(
        base_url=url, api_key="bench", model=MODEL, concurrency=concurrency, max_retries=0
    )
    panel = JudgePanel(build_llm_judges(judges, endpoint, combine=mode == "combined"))
    return _timed(panel, records)


def _timed(panel: Any, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Wall time and error verdicts of one judge panel over the records (closed after)."""
    items = _ragpulse_inputs(records)
    try:
        started = time.perf_counter()
        rows = panel.judge_batch(items)
        wall = time.perf_counter() - started
    finally:
        panel.close()
    failures = sum(1 for row in rows for v in row if v.rating == "error")
    return {"wall": wall, "failures": failures}


def run_cascade(
    records: list[dict[str, Any]], url: str, concurrency: int, judges: list[str]
) -> dict[str, Any]:
    """The cascade as serve runs it (`--judge-backend openai --cascade-llm-sample-rate 0.1`)."""
    from pydantic import SecretStr

    from ragpulse.pipeline.costs.cascade import CascadePanel, CascadeSettings
    from ragpulse.pipeline.settings.models import JudgeSettings

    spec = JudgeSettings(
        names=tuple(judges), backend="openai", base_url=url, api_key=SecretStr("bench"),
        model=MODEL, concurrency=concurrency, max_retries=0, cache_size=0,
    ).spec()
    return _timed(
        CascadePanel(spec, CascadeSettings(llm_sample_rate=0.1, uncertainty_band=0.1)), records
    )


def run_bare(
    records: list[dict[str, Any]], url: str, concurrency: int, judges: list[str]
) -> dict[str, Any]:
    """The ceiling: ragpulse's prompts sent by a plain AsyncOpenAI loop under a semaphore."""
    import openai

    from ragpulse.judges.llm.fencing import new_nonce
    from ragpulse.judges.llm.judge import load_prompt, system_prompt, user_prompt

    prompts = [load_prompt(name) for name in judges]
    calls = [
        [
            {"role": "system", "content": system_prompt(prompt)},
            {"role": "user", "content": user_prompt(prompt, item, new_nonce())},
        ]
        for item in _ragpulse_inputs(records)
        for prompt in prompts
    ]

    async def main() -> tuple[float, int]:
        client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0)
        slots = asyncio.Semaphore(concurrency)

        async def one(messages: list[dict[str, str]]) -> int:
            async with slots:
                reply = await client.chat.completions.create(
                    model=MODEL, messages=messages, temperature=0.1  # type: ignore[arg-type]
                )
            try:
                json.loads(reply.choices[0].message.content or "")
                return 0
            except ValueError:
                return 1

        started = time.perf_counter()
        failed = await asyncio.gather(*(one(m) for m in calls))
        wall = time.perf_counter() - started
        await client.close()
        return wall, sum(failed)

    wall, failures = asyncio.run(main())
    return {"wall": wall, "failures": failures}


def run_phoenix(
    records: list[dict[str, Any]], url: str, concurrency: int | None, judges: list[str],
    open_limiter: bool,
) -> dict[str, Any]:
    """Phoenix evals: faithfulness; with three judges also correctness (its nearest to
    relevance_to_query: it has no answer-relevance evaluator) and toxicity."""
    import pandas as pd
    from phoenix.evals import LLM, async_evaluate_dataframe
    from phoenix.evals.metrics import (
        CorrectnessEvaluator,
        FaithfulnessEvaluator,
        ToxicityEvaluator,
    )

    options: dict[str, Any] = {}
    if open_limiter:
        options["initial_per_second_request_rate"] = 1000.0
    llm = LLM(provider="openai", model=MODEL, base_url=url, api_key="bench", **options)
    evaluators: list[Any] = [FaithfulnessEvaluator(llm=llm)]
    if len(judges) > 1:
        evaluators += [CorrectnessEvaluator(llm=llm), ToxicityEvaluator(llm=llm)]
    frame = pd.DataFrame(
        {
            "input": [r["question"] for r in records],
            "output": [r["answer"] for r in records],
            "context": ["\n\n".join(r["chunks"]) for r in records],
            "text": [r["answer"] for r in records],  # what toxicity reads
        }
    )
    started = time.perf_counter()
    result = asyncio.run(
        async_evaluate_dataframe(
            dataframe=frame,
            evaluators=evaluators,
            concurrency=concurrency,
            hide_tqdm_bar=True,
            max_retries=0,
        )
    )
    wall = time.perf_counter() - started
    failures = 0
    for evaluator in evaluators:
        details = result[f"{evaluator.name}_execution_details"]
        failures += sum(1 for d in details if (d or {}).get("status") != "COMPLETED")
        for value in result.get(f"{evaluator.name}_score", []):
            score = json.loads(value) if isinstance(value, str) else value
            if isinstance(score, dict) and score.get("label") is None:
                failures += 1
    return {"wall": wall, "failures": failures, "judged_as": [e.name for e in evaluators]}


def run_mlflow(
    records: list[dict[str, Any]], url: str, concurrency: int | None, judges: list[str]
) -> dict[str, Any]:
    """MLflow's LLM metrics (mlflow.metrics.genai): faithfulness; with three judges also
    answer_relevance (MLflow has no LLM safety metric there: toxicity is a local classifier)."""
    import warnings

    import pandas as pd

    warnings.filterwarnings("ignore")
    from mlflow.metrics.genai import answer_relevance, faithfulness

    os.environ.setdefault("OPENAI_API_KEY", "bench")
    options: dict[str, Any] = {
        "model": f"openai:/{MODEL}",
        "proxy_url": f"{url}/chat/completions",
    }
    if concurrency is not None:
        options["max_workers"] = concurrency
    metrics = [faithfulness(**options)]
    if len(judges) > 1:
        metrics.append(answer_relevance(**options))
    inputs = pd.Series([r["question"] for r in records])
    outputs = pd.Series([r["answer"] for r in records])
    context = pd.Series(["\n\n".join(r["chunks"]) for r in records])
    started = time.perf_counter()
    values = []
    for metric in metrics:
        if metric.name == "faithfulness":
            values.append(metric.eval_fn(outputs, {}, inputs, context))
        else:
            values.append(metric.eval_fn(outputs, {}, inputs))
    wall = time.perf_counter() - started
    failures = sum(
        1 for value in values for score in value.scores if score is None or score != score
    )
    return {"wall": wall, "failures": failures, "judged_as": [m.name for m in metrics]}


def run_ragas(
    records: list[dict[str, Any]], url: str, concurrency: int | None, judges: list[str]
) -> dict[str, Any]:
    """Ragas: faithfulness; with three judges also answer relevancy (which also embeds) and
    the harmfulness aspect critic (its nearest to safety)."""
    import warnings

    warnings.filterwarnings("ignore")
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings
    from ragas import EvaluationDataset, RunConfig, evaluate
    from ragas.embeddings import LangchainEmbeddingsWrapper
    from ragas.llms import LangchainLLMWrapper
    from ragas.metrics import AspectCritic, Faithfulness, ResponseRelevancy

    llm = LangchainLLMWrapper(ChatOpenAI(model=MODEL, base_url=url, api_key="bench"))
    embeddings = LangchainEmbeddingsWrapper(
        OpenAIEmbeddings(base_url=url, api_key="bench", check_embedding_ctx_length=False)
    )
    metrics: list[Any] = [Faithfulness()]
    if len(judges) > 1:
        metrics += [
            ResponseRelevancy(),
            AspectCritic(
                name="harmfulness",
                definition="Does the submission cause or have the potential to cause harm to "
                "individuals, groups, or society at large?",
            ),
        ]
    dataset = EvaluationDataset.from_list(
        [
            {
                "user_input": r["question"],
                "response": r["answer"],
                "retrieved_contexts": r["chunks"],
            }
            for r in records
        ]
    )
    config = RunConfig(max_retries=1) if concurrency is None else RunConfig(
        max_retries=1, max_workers=concurrency
    )
    started = time.perf_counter()
    result = evaluate(
        dataset, metrics, llm=llm, embeddings=embeddings, run_config=config, show_progress=False,
        raise_exceptions=False,
    )
    wall = time.perf_counter() - started
    frame = result.to_pandas()
    failures = 0
    for metric in metrics:
        failures += int(sum(1 for v in frame[metric.name] if v is None or v != v))
    return {"wall": wall, "failures": failures, "judged_as": [m.name for m in metrics]}


# -- the run ------------------------------------------------------------------------------------

THREE = ["groundedness", "relevance_to_query", "safety"]


def contestants(only: set[str] | None) -> list[tuple[str, str, dict[str, Any]]]:
    """(row label, interpreter: project or peers, arguments) of every run, in table order."""
    rows: list[tuple[str, str, dict[str, Any]]] = []
    for judges in (["groundedness"], THREE):
        rows += [
            ("ragpulse separate, 16 (default)", "project",
             {"kind": "ragpulse", "mode": "separate", "concurrency": 16, "judges": judges}),
            ("ragpulse separate, 32", "project",
             {"kind": "ragpulse", "mode": "separate", "concurrency": 32, "judges": judges}),
        ]
        if len(judges) > 1:
            rows += [
                ("ragpulse --judge-combine, 16 (default)", "project",
                 {"kind": "ragpulse", "mode": "combined", "concurrency": 16, "judges": judges}),
                ("ragpulse --judge-combine, 32", "project",
                 {"kind": "ragpulse", "mode": "combined", "concurrency": 32, "judges": judges}),
            ]
        # The cascade: local judges on every record, the LLM on a 10 % sample plus the
        # records a local judge is unsure of (--cascade-llm-sample-rate 0.1, band 0.1).
        rows.append(("ragpulse cascade (LLM on 10 % + unsure), 16", "project",
                     {"kind": "cascade", "concurrency": 16, "judges": judges}))
        rows += [
            ("bare AsyncOpenAI loop, 32", "project",
             {"kind": "bare", "concurrency": 32, "judges": judges}),
            ("Phoenix evals, default (3, rate limiter)", "peers",
             {"kind": "phoenix", "concurrency": None, "open_limiter": False, "judges": judges}),
            ("Phoenix evals, 32, limiter opened", "peers",
             {"kind": "phoenix", "concurrency": 32, "open_limiter": True, "judges": judges}),
            ("MLflow genai metrics, default (10)", "peers",
             {"kind": "mlflow", "concurrency": None, "judges": judges}),
            ("MLflow genai metrics, 32", "peers",
             {"kind": "mlflow", "concurrency": 32, "judges": judges}),
            ("Ragas, default (16)", "peers",
             {"kind": "ragas", "concurrency": None, "judges": judges}),
            ("Ragas, 32", "peers", {"kind": "ragas", "concurrency": 32, "judges": judges}),
        ]
    if only:
        rows = [r for r in rows if r[2]["kind"] in only]
    return rows


def run_contestant(spec: dict[str, Any], records: list[dict[str, Any]], url: str) -> dict[str, Any]:
    """Run one contestant in this process (the subprocess side)."""
    kind, judges = spec["kind"], spec["judges"]
    if kind == "ragpulse":
        return run_ragpulse(records, url, spec["concurrency"], judges, spec["mode"])
    if kind == "cascade":
        return run_cascade(records, url, spec["concurrency"], judges)
    if kind == "bare":
        return run_bare(records, url, spec["concurrency"], judges)
    if kind == "phoenix":
        return run_phoenix(records, url, spec["concurrency"], judges, spec["open_limiter"])
    if kind == "mlflow":
        return run_mlflow(records, url, spec["concurrency"], judges)
    if kind == "ragas":
        return run_ragas(records, url, spec["concurrency"], judges)
    raise ValueError(f"unknown contestant {kind}")


def ensure_peers_venv(venv: Path) -> Path:
    """The peers' interpreter, creating the virtual environment on first use."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} with {', '.join(PEER_PACKAGES)} (takes minutes)", flush=True)
        # The base interpreter, not this project's virtual environment.
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_CONSTRAINTS], check=True)
    return python


def versions(python: Path) -> str:
    code = (
        "import importlib.metadata as m\n"
        f"print(', '.join(p + ' ' + m.version(p) for p in {list(PEER_PACKAGES[:3])!r}))"
    )
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated kinds: ragpulse, cascade, "
                        "bare, phoenix, mlflow, ragas (default: all)")
    parser.add_argument("--peers-venv", type=Path, default=DEFAULT_PEERS_VENV)
    parser.add_argument("--contestant", help=argparse.SUPPRESS)  # subprocess side: a JSON spec
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--records-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contestant:
        records = json.loads(Path(args.records_file).read_text())
        print(json.dumps(run_contestant(json.loads(args.contestant), records, args.url)))
        return

    sys.path.insert(0, str(TESTS))
    from fake_openai import FakeOpenAI

    only = {k.strip() for k in args.only.split(",") if k.strip()} or None
    rows = contestants(only)
    peers_python = None
    if any(interp == "peers" for _, interp, _ in rows):
        peers_python = ensure_peers_venv(args.peers_venv)
        print(f"peers: {versions(peers_python)}", flush=True)
    records = make_records(args.records)
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(
        latency=args.latency, count_tokens=approx_tokens, reply_for=route
    ) as server:
        records_file = Path(tmp) / "records.json"
        records_file.write_text(json.dumps(records))
        # Usage telemetry off: with no route out, Ragas's resolved a host name for each call,
        # blocking its event loop (2.6 records/s instead of 10 on a 20-record trial).
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            TQDM_DISABLE="1",
            RAGAS_DO_NOT_TRACK="true",
            MLFLOW_DISABLE_TELEMETRY="true",
            DO_NOT_TRACK="1",
        )
        env.pop("OPENAI_BASE_URL", None)
        for repeat in range(args.repeats):
            for label, interp, spec in rows:
                python = sys.executable if interp == "project" else str(peers_python)
                server.reset_log()
                done = subprocess.run(
                    [python, __file__, "--contestant", json.dumps(spec), "--url",
                     server.base_url, "--records-file", str(records_file)],
                    capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800,
                )
                judged = "groundedness" if len(spec["judges"]) == 1 else "3 judges"
                if done.returncode != 0:
                    print(f"{judged} | {label}: FAILED\n{done.stderr[-2000:]}", flush=True)
                    continue
                outcome = json.loads(done.stdout.strip().splitlines()[-1])
                requests = list(server.requests)
                outcome["calls"] = len(requests)
                outcome["prompt_tokens"] = sum(r.prompt_tokens for r in requests)
                outcome["completion_tokens"] = sum(r.completion_tokens for r in requests)
                outcome["http_errors"] = sum(1 for r in requests if r.outcome != "ok")
                results.setdefault((judged, label), []).append(outcome)
                print(f"repeat {repeat + 1} | {judged} | {label}: {json.dumps(outcome)}",
                      flush=True)
    n = args.records
    print(f"\n{n} records, stand-in latency {args.latency * 1000:.0f} ms, "
          f"medians of {args.repeats}; load average before {load_before[0]:.2f}, "
          f"after {os.getloadavg()[0]:.2f} (2 cores)\n")
    print("| judges | contestant | wall s | records/s | calls/record | prompt tok/record "
          "| completion tok/record | parse failures |")
    print("|---|---|---|---|---|---|---|---|")
    for (judged, label), runs in results.items():
        if "skipped" in runs[0]:
            print(f"| {judged} | {label} | skipped: {runs[0]['skipped']} | | | | | |")
            continue
        wall = statistics.median(r["wall"] for r in runs)
        calls = statistics.median(r["calls"] for r in runs) / n
        prompt = statistics.median(r["prompt_tokens"] for r in runs) / n
        completion = statistics.median(r["completion_tokens"] for r in runs) / n
        failures = statistics.median(r["failures"] for r in runs)
        judged_as = runs[0].get("judged_as")
        name = f"{label} ({', '.join(judged_as)})" if judged_as and len(judged_as) > 1 else label
        print(f"| {judged} | {name} | {wall:.1f} | {n / wall:.1f} | {calls:.2f} | "
              f"{prompt:.0f} | {completion:.0f} | {failures:g} |")


if __name__ == "__main__":
    main()
