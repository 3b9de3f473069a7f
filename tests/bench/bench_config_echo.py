"""Which settings errors show a planted secret value, for each code tree given.

Each case runs `ragpulse serve ... --print-config` with a value of the wrong type that looks
like an API key (in a config file, the environment, the sampling rules, the price table, the
Kafka properties, a calibration file), with PYTHONPATH set to a code tree, and says whether the
error shows the value.

    .venv/bin/python tests/bench/bench_config_echo.py --code /tmp/base --code .
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli import ragpulse_command

SECRET = "sk-SECRETMARK-0123456789"
SERVE = ["serve", "--kafka-bootstrap", "127.0.0.1:9", "--topic", "t"]
OPENAI = ["--judge-backend", "openai", "--judge-base-url", "http://127.0.0.1:9/v1"]


def cases(folder: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    def file(name: str, text: str) -> str:
        (folder / name).write_text(text)
        return str(folder / name)

    config = {
        "config int": f"judge-concurrency: {SECRET}\n",
        "config float": f"sample-rate: {SECRET}\n",
        "config choice": f"on-offset-reset: {SECRET}\n",
        "config boolean": f"state-reset: {SECRET}\n",
        "config duration": f"window: {SECRET}\n",
        "config judge name": f"judges: [safety, {SECRET}]\n",
        "config url": f"judge-base-url: 'ht!tp://{SECRET}'\n",
    }
    found: dict[str, tuple[list[str], dict[str, str]]] = {
        name: ([*SERVE, "--config", file(f"{i}.yaml", text)], {})
        for i, (name, text) in enumerate(config.items())
    }
    for name, var in (("env int", "RAGPULSE_JUDGE_CONCURRENCY"),
                      ("env choice", "RAGPULSE_ON_OFFSET_RESET"),
                      ("env boolean", "RAGPULSE_STATE_RESET")):
        found[name] = (SERVE, {var: SECRET})
    found["sampling rate"] = ([*SERVE, "--sampling-rules", file(
        "r.yaml", f"rules:\n- {{name: r, when: {{app: a}}, rate: {SECRET}}}\n")], {})
    found["price"] = ([*SERVE, *OPENAI, "--judge-budget-per-hour", "10", "--judge-price-table",
                       file("p.yaml", f"gpt-4o-mini: {{prompt: {SECRET}, completion: 0.6}}\n")],
                      {})
    found["kafka property"] = ([*SERVE, "--kafka-properties", file(
        "k.properties", f"security.protocol={SECRET}\n")], {})
    found["calibration count"] = ([*SERVE, "--judge-calibration", file(
        "cal.json", f'{{"safety": {{"positives": "{SECRET}"}}}}\n')], {})
    return found


def shows(code: Path, argv: list[str], env: dict[str, str]) -> bool:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAGPULSE_")}
    done = subprocess.run(
        [*ragpulse_command(), *argv, "--print-config"],
        env={**base, "PYTHONPATH": str(code.resolve()), **env},
        capture_output=True, text=True, timeout=120, check=False,
    )
    return SECRET in done.stdout + done.stderr


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--code", action="append", type=Path, required=True)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        table = cases(Path(tmp))
        results = {str(c): {n: shows(c, *table[n]) for n in table} for c in a.code}
    print(f"{'case':<22}" + "".join(f"{c:>22}" for c in results))
    for name in table:
        print(f"{name:<22}" + "".join(
            f"{'shows it' if r[name] else '-':>22}" for r in results.values()))
    print(f"{'shown':<22}" + "".join(
        f"{sum(r.values())} of {len(r):<16}" for r in results.values()))


if __name__ == "__main__":
    main()
