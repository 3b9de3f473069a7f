"""How often the chatbot users' text appears in serve's log at DEBUG, for two code trees.

For whoever checks that logs follow the redaction policy at every level. Each code tree runs
one real `ragpulse --log-level DEBUG serve --redact-pii on` on a real (Apache Kafka) broker with
the LLM judge stand-in (tests/fake_openai.py), over N events whose question, answer and passage
each carry words of their own and planted PII (an e-mail address, a phone number); once serve has
judged every event, it counts in serve's log (stdout and stderr) the occurrences of each
event's own words and of the PII. The words are not in any prompt file or log format, so each
occurrence is users' text in the log.

    .venv/bin/python tests/bench/bench_debug_log.py --code /tmp/base --code . [--events N]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_crash_spend import serve_class
from cli import ragpulse_command
from fake_openai import FakeOpenAI
from kafka_broker import ApacheKafkaBroker
from serve_process import ServeProcess, caught_up
from users_text import planted_events


def at_debug(cls: type[ServeProcess]) -> type[ServeProcess]:
    class AtDebug(cls):  # type: ignore[valid-type, misc]
        def command(self) -> list[str]:
            return [*ragpulse_command(), "--log-level", "DEBUG", *self.serve_args()]

    return AtDebug


def run(code: Path, n_events: int) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": str(code.resolve())}
    events, words, pii = planted_events(n_events)
    with tempfile.TemporaryDirectory() as tmp, ApacheKafkaBroker() as broker, FakeOpenAI() as ep:
        broker.create_topic("debug", 2)
        broker.produce("debug", events)
        serve = at_debug(serve_class(code))(
            broker.bootstrap, "debug", Path(tmp) / "state.sqlite",
            ["--judge-backend", "openai", "--judge-base-url", ep.base_url,
             "--judges", "groundedness,safety", "--redact-pii", "on", "--window", "1h"],
            env=env,
        )
        serve.start()
        serve.wait_for(caught_up(n_events), 300, "every event read")
        serve.wait_for(
            lambda m: m.total("ragpulse_judge_verdicts_total") >= 2 * n_events, 300,
            "every event judged",
        )
        serve.terminate()
        text = serve.log_text()
        serve.stop()
    return {
        "log lines": text.count("\n"),
        "users' words in the log": sum(len(re.findall(re.escape(w), text)) for w in words),
        "planted PII in the log": sum(text.count(p) for p in pii),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--code", action="append", type=Path, required=True)
    p.add_argument("--events", type=int, default=40)
    a = p.parse_args()
    results = {str(c): run(c, a.events) for c in a.code}
    print(f"serve at DEBUG, --redact-pii on, {a.events} events, LLM judges groundedness,safety")
    print(f"{'':<28}" + "".join(f"{c:>24}" for c in results))
    for key in next(iter(results.values())):
        print(f"  {key:<26}" + "".join(f"{r[key]:>24}" for r in results.values()))


if __name__ == "__main__":
    main()
