"""What session judges cost next to per-answer judges, on `ragpulse simulate` conversations.

Simulates 600 turns in conversations of 4 (`simulate(..., conversation_turns=4)`, what
`ragpulse simulate --conversation-turns 4` writes), runs `ragpulse run` with the openai backend
against the local stand-in endpoint (tests/fake_openai.py; it counts a prompt's words as its
tokens) with one per-answer judge and the three LLM session judges, and prints the calls and
prompt tokens of each judge from the run's metrics.prom. Verdict cache off, so every call is
counted. About half a minute.

    PYTHONPATH=. .venv/bin/python tests/bench/bench_session_cost.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fake_openai import FakeOpenAI
from prometheus_client.parser import text_string_to_metric_families

from ragpulse.pipeline.cli import main as ragpulse
from ragpulse.pipeline.commands.simulate import simulate

TURNS, EVENTS = 4, 600
ANSWER_JUDGE = "relevance_to_query"
SESSION_JUDGES = ("conversation_completeness", "knowledge_retention", "user_frustration")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI() as server:
        src = Path(tmp) / "talks.jsonl"
        src.write_bytes(b"".join(
            e.payload + b"\n"
            for e in simulate(11, EVENTS, 1_763_632_800.0, conversation_turns=TURNS)
        ))
        os.environ["OPENAI_API_KEY"] = "sk-bench"
        out = Path(tmp) / "out"
        code = ragpulse([
            "run", str(src), "--output", str(out), "--judge-backend", "openai",
            "--judge-base-url", server.base_url, "--judge-cache-size", "0",
            "--judges", ANSWER_JUDGE, "--session-judges", ",".join(SESSION_JUDGES),
        ])
        if code != 0:
            return code
        calls: dict[str, float] = {}
        prompt: dict[str, float] = {}
        sessions = 0.0
        for family in text_string_to_metric_families((out / "metrics.prom").read_text()):
            for s in family.samples:
                if s.name == "ragpulse_judge_calls_total":
                    calls[s.labels["judge"]] = s.value
                elif s.name == "ragpulse_judge_tokens_total" and s.labels["kind"] == "prompt":
                    prompt[s.labels["judge"]] = s.value
                elif s.name == "ragpulse_sessions_judged_total":
                    sessions += s.value
    print(f"{EVENTS} turns in {sessions:.0f} conversations of {TURNS} turns "
          "(ragpulse simulate --conversation-turns 4, seed 11)")
    print("| judge | calls | calls per turn | prompt tokens per call |")
    print("|---|---|---|---|")
    for judge in (ANSWER_JUDGE, *SESSION_JUDGES):
        n = calls.get(judge, 0.0)
        per_call = prompt.get(judge, 0.0) / n if n else 0.0
        print(f"| {judge} | {n:.0f} | {n / EVENTS:.2f} | {per_call:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
