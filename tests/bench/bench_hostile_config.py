"""Hostile configuration, before and after: exit code, traceback or not, seconds, per case.

    python tests/bench/bench_hostile_config.py --before /path/to/old/checkout --after .

Each case runs `ragpulse serve ... --print-config` with PYTHONPATH set to a checkout (so two
versions of the code run side by side, interleaved), with a 120 s limit. `rules-check` times
only the sampling rules' check (`plan_from_data`) of 100,000 rules built in memory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVE = ["serve", "--kafka-bootstrap", "127.0.0.1:9", "--topic", "t"]
OPENAI = ["--judge-backend", "openai", "--judge-base-url", "http://127.0.0.1:9/v1"]
BUDGET = [*OPENAI, "--judge-budget-per-hour", "1000"]
LIMIT_S = 120.0
RULES_CHECK = (
    "import time; from ragpulse.pipeline.costs.sampling import plan_from_data; "
    "rules = [{'name': f'r{i}', 'when': {'app': f'a{i}'}, 'rate': 0.5} for i in range(100000)]; "
    "t = time.perf_counter(); plan_from_data({'rules': rules}, 1.0); "
    "print(f'{time.perf_counter() - t:.2f}')"
)


def cases(folder: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    def file(name: str, content: str | bytes) -> str:
        path = folder / name
        if isinstance(content, str):
            path.write_text(content)
        else:
            path.write_bytes(content)
        return str(path)

    deep = file("deep.yaml", "[" * 5000 + "]" * 5000 + "\n")
    latin1 = file("latin1.yaml", "window: 5m # \xe9t\xe9\n".encode("latin-1"))
    rules = "rules:\n" + "".join(
        f"- {{name: r{i}, when: {{app: a{i}}}, rate: 0.5}}\n" for i in range(100_000)
    )
    prices = "gpt-4o-mini: {prompt: .nan, completion: 0.6}\n"
    return {
        "deep --config": ([*SERVE, "--config", deep], {}),
        "deep --sampling-rules": ([*SERVE, "--sampling-rules", deep], {}),
        "deep --judge-price-table": ([*SERVE, *BUDGET, "--judge-price-table", deep], {}),
        "deep --custom-judge": ([*SERVE, *OPENAI, "--custom-judge", deep], {}),
        "not UTF-8 --config": ([*SERVE, "--config", latin1], {}),
        "not UTF-8 --judge-price-table": ([*SERVE, *BUDGET, "--judge-price-table", latin1], {}),
        "10 MB list --config": (
            [*SERVE, "--config", file("big.yaml", "judges: [" + "safety, " * 1_250_000 + "x]\n")],
            {},
        ),
        "100,000 sampling rules": (
            [*SERVE, "--sampling-rules", file("rules.yaml", rules)], {}
        ),
        ".nan price": (
            [*SERVE, *BUDGET, "--judge-price-table", file("prices.yaml", prices)], {}
        ),
        "RAGPULSE_JUDGE_BUGDET_PER_HOUR": (
            [*SERVE, *OPENAI], {"RAGPULSE_JUDGE_BUGDET_PER_HOUR": "1000"}
        ),
        "--max-batch-events 1e20": ([*SERVE, "--max-batch-events", str(10**20)], {}),
    }


def run(checkout: Path, argv: list[str], env: dict[str, str]) -> str:
    full_env = {**os.environ, "PYTHONPATH": str(checkout), **env}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ragpulse.pipeline.cli", *argv, "--print-config"],
            capture_output=True, text=True, env=full_env, timeout=LIMIT_S, check=False,
            cwd=checkout,  # `python -m` puts the working directory first on sys.path
        )
    except subprocess.TimeoutExpired:
        return f"no answer in {LIMIT_S:.0f} s"
    took = time.perf_counter() - start
    errors = [
        line for line in done.stderr.splitlines()
        if line.strip() and " INFO " not in line and "apitools" not in line
    ]
    what = "traceback" if "Traceback" in done.stderr else f"{len(errors)} line(s)"
    if done.returncode == 0:
        what = "accepted"
    return f"exit {done.returncode}, {what}, {took:.1f} s"


def rules_check(checkout: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", RULES_CHECK],
            capture_output=True, text=True, env=env, timeout=LIMIT_S * 5, check=False,
            cwd=checkout,
        )
    except subprocess.TimeoutExpired:
        return f"over {LIMIT_S * 5:.0f} s"
    return f"{done.stdout.strip()} s" if done.returncode == 0 else done.stderr[-200:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    args = parser.parse_args()
    args.before, args.after = args.before.resolve(), args.after.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        table = cases(Path(tmp))
        print("| case | before | after |\n|---|---|---|")
        for name, (argv, env) in table.items():
            before, after = run(args.before, argv, env), run(args.after, argv, env)
            print(f"| {name} | {before} | {after} |", flush=True)
        print(f"| rules check, 100,000 rules in memory | {rules_check(args.before)} | "
              f"{rules_check(args.after)} |")


if __name__ == "__main__":
    main()
