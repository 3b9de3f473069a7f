"""Hostile configuration is one line on stderr and exit code 2, never a traceback or a hang.

Each case was measured on the code before this test (issue 19): a 5,000-deep YAML raised
RecursionError in every file loader, invalid UTF-8 gave a traceback, a `.nan` price was
accepted (then every cycle failed after paying its calls), a misspelt RAGPULSE_ variable was
ignored (a typo in the budget's variable meant no budget), `--max-batch-events 1e20` was
accepted, and the sampling rules' name check compared each rule with every earlier one.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from cli import one_line_error, ragpulse

from ragpulse.judges.yaml_file import MAX_BYTES, MAX_DEPTH, YamlFileError, loads
from ragpulse.pipeline.costs import sampling

SERVE = ("serve", "--kafka-bootstrap", "127.0.0.1:9", "--topic", "logs")
OPENAI = ("--judge-backend", "openai", "--judge-base-url", "http://127.0.0.1:9/v1")
BUDGET = (*OPENAI, "--judge-budget-per-hour", "1000")
DEEP_FLOW = "[" * 5000 + "]" * 5000 + "\n"
DEEP_BLOCK = "".join("  " * i + "k:\n" for i in range(MAX_DEPTH + 10)) + "  " * 80 + "v\n"


def _file(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    else:
        path.write_bytes(content)
    return str(path)


def _refused(*argv: str, env: dict[str, str] | None = None) -> str:
    done = ragpulse(*SERVE, *argv, "--print-config", env=env)
    return one_line_error(done.returncode, done.stderr, allow_info=True)


@pytest.mark.slow  # runs the CLI on large files
@pytest.mark.parametrize("shape", [DEEP_FLOW, DEEP_BLOCK], ids=["flow", "block"])
@pytest.mark.parametrize(
    "flags",
    [
        ("--config",),
        ("--sampling-rules",),
        (*BUDGET, "--judge-price-table"),
        (*OPENAI, "--custom-judge"),
    ],
    ids=["config", "sampling-rules", "judge-price-table", "custom-judge"],
)
def test_a_5000_deep_yaml_file_is_one_line_in_every_loader(
    tmp_path: Path, flags: tuple[str, ...], shape: str
) -> None:
    line = _refused(*flags, _file(tmp_path, "deep.yaml", shape))
    assert "nest" in line  # "nested deeper than 64 levels", or libyaml's own nesting limit


@pytest.mark.slow  # runs the CLI on large files
@pytest.mark.parametrize(
    "flags",
    [("--config",), (*BUDGET, "--judge-price-table"), ("--sampling-rules",)],
    ids=["config", "judge-price-table", "sampling-rules"],
)
def test_a_file_that_is_not_utf8_is_one_line_naming_the_line(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    path = _file(tmp_path, "latin1.yaml", "# settings\nwindow: 5m # \xe9t\xe9\n".encode("latin-1"))
    assert _refused(*flags, path).endswith(f"{path}: not UTF-8 (byte 0xe9 on line 2)")


@pytest.mark.slow  # runs the CLI on large files
def test_a_10_mb_list_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    path = _file(tmp_path, "big.yaml", "judges: [" + "safety, " * 1_250_000 + "safety]\n")
    line = _refused("--config", path)
    assert line.endswith(f"config {path}: larger than {MAX_BYTES:,} bytes, the most ragpulse reads")


@pytest.mark.parametrize("price", [".nan", ".inf", "-1"])
def test_a_price_that_is_not_a_finite_number_is_refused_at_start(
    tmp_path: Path, price: str
) -> None:
    table = _file(tmp_path, "prices.yaml", f"gpt-4o-mini: {{prompt: {price}, completion: 0.6}}\n")
    line = _refused(*BUDGET, "--judge-price-table", table)
    assert "the prompt price must be a finite number >= 0" in line


def test_a_misspelt_ragpulse_variable_is_refused_naming_the_closest_one() -> None:
    env = {**os.environ, "RAGPULSE_JUDGE_BUGDET_PER_HOUR": "1000"}
    line = _refused(env=env)
    assert line == (
        "ragpulse serve: environment RAGPULSE_JUDGE_BUGDET_PER_HOUR: no such setting (did you "
        "mean RAGPULSE_JUDGE_BUDGET_PER_HOUR?); RAGPULSE_<FLAG> variables set the command's "
        "flags (see --help)"
    )


def test_another_commands_variable_is_left_to_it() -> None:
    done = ragpulse(*SERVE, "--print-config", env={**os.environ, "RAGPULSE_RATINGS_TOPIC": "r"})
    assert done.returncode == 0, done.stderr
    assert "RAGPULSE_RATINGS_TOPIC sets a flag of `ragpulse stream` only: ignored" in done.stderr


def test_a_max_batch_events_of_1e20_is_refused() -> None:
    line = _refused("--max-batch-events", str(10**20))
    assert line.startswith("ragpulse serve: invalid settings: --max-batch-events: ")
    assert "1000000" in line


def test_aliases_are_refused_before_they_are_expanded() -> None:
    levels = "abcdefghi"
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in itertools.pairwise(levels)
    )
    with pytest.raises(YamlFileError, match=r"aliases \(\*a\) are not supported"):
        loads(laughs)


class _CountedName(str):
    """A rule name that counts how often it is compared for equality."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _CountedName.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_the_rule_names_are_checked_in_linear_time() -> None:
    n = 4000
    rules = [{"name": _CountedName(f"r{i}"), "when": {"app": f"a{i}"}, "rate": 0.5}
             for i in range(n)]
    _CountedName.compared = 0
    plan = sampling.plan_from_data({"rules": rules}, 1.0)
    assert len(plan.rules) == n
    # A check against each earlier rule makes n * (n + 1) / 2 (8 million) comparisons.
    assert _CountedName.compared <= 2 * n


def test_a_key_written_twice_is_refused_naming_the_key_and_both_lines(tmp_path: Path) -> None:
    config = _file(tmp_path, "c.yaml", "judges: safety\nwindow: 5m\njudges: groundedness\n")
    line = _refused("--config", config)
    assert line.endswith(
        f"config {config}: the key 'judges' is written twice (lines 1 and 3): write each key once"
    )
    with pytest.raises(YamlFileError, match=r"'k' is written twice \(lines 2 and 2\)"):
        loads("rules:\n  - {k: 1, k: 2}\n")


SHADOW = (
    "root:$6$Zq0secret0salt$AbCdEfGhIjKlMnOpQrStUvWxYz0123456789:19000:0:99999:7:::\n"
    "daemon:*:19000:0:99999:7:::\n"
    "alice:$y$j9T$sEcReT.hash.of.alice$MoreSecretBits:19001:0:99999:7:::\n"
)


@pytest.mark.parametrize(
    "content",
    [
        SHADOW,
        SHADOW + SHADOW,  # the same lines twice
        "API_TOKEN=sk-live-0123456789abcdef\nDB_PASSWORD=hunter2-secret\n",
        "[client]\npassword = hunter2-secret\nuser = alice-secret\n",
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC-secret\n"
        "-----END PRIVATE KEY-----\n",
    ],
    ids=["shadow", "shadow-twice", "dotenv", "ini", "pem"],
)
def test_a_file_that_is_not_a_config_is_refused_without_printing_its_lines(
    tmp_path: Path, content: str
) -> None:
    path = _file(tmp_path, "not-a-config", content)
    line = _refused(env={**os.environ, "RAGPULSE_CONFIG": path})
    assert line.startswith(f"ragpulse serve: config {path}: ")
    told = line.removeprefix(f"ragpulse serve: config {path}: ")
    secret_words = {w for w in content.replace("=", " ").replace(":", " ").split() if len(w) > 5}
    assert [w for w in secret_words if w in told] == []


SECRET = "sk-live-0123456789abcdef"
# (flags before, a file's name and content, the flag that takes the file), one per kind of value
# check: int, float, a closed set, a boolean, a duration, a list of names, a URL, each from a
# config file and from the environment; the rate of a sampling rule, a price, a Kafka property,
# a calibration count.
MISPLACED = {
    "config int": ((), "c.yaml", f"judge-concurrency: {SECRET}\n", "--config"),
    "config float": ((), "c.yaml", f"sample-rate: {SECRET}\n", "--config"),
    "config choice": ((), "c.yaml", f"on-offset-reset: {SECRET}\n", "--config"),
    "config boolean": ((), "c.yaml", f"state-reset: {SECRET}\n", "--config"),
    "config duration": ((), "c.yaml", f"window: {SECRET}\n", "--config"),
    "config judge name": ((), "c.yaml", f"judges: [safety, {SECRET}]\n", "--config"),
    "config url": (OPENAI[:2], "c.yaml", f"judge-base-url: 'ht!tp://{SECRET}'\n", "--config"),
    "sampling rate": (
        (), "r.yaml", f"rules:\n- {{name: r, when: {{app: a}}, rate: {SECRET}}}\n",
        "--sampling-rules",
    ),
    "price": (
        BUDGET, "p.yaml", f"gpt-4o-mini: {{prompt: {SECRET}, completion: 0.6}}\n",
        "--judge-price-table",
    ),
    "kafka property": ((), "k.properties", f"security.protocol={SECRET}\n", "--kafka-properties"),
}
MISPLACED_IN_ENV = {
    "env int": "RAGPULSE_JUDGE_CONCURRENCY",
    "env choice": "RAGPULSE_ON_OFFSET_RESET",
    "env boolean": "RAGPULSE_STATE_RESET",
    "env duration": "RAGPULSE_WINDOW",
}


@pytest.mark.parametrize("case", list(MISPLACED))
def test_a_value_of_the_wrong_type_in_a_file_is_refused_without_showing_it(
    tmp_path: Path, case: str
) -> None:
    """Before, 10 of these 10 errors printed the value (a secret put under the wrong key)."""
    flags, name, content, flag = MISPLACED[case]
    line = _refused(*flags, flag, _file(tmp_path, name, content))
    assert SECRET not in line and "0123456789" not in line
    assert "(value not shown)" in line or "position 2 of 2" in line


@pytest.mark.parametrize("case", list(MISPLACED_IN_ENV))
def test_a_value_of_the_wrong_type_in_the_environment_is_refused_without_showing_it(
    case: str,
) -> None:
    variable = MISPLACED_IN_ENV[case]
    line = _refused(env={**os.environ, variable: SECRET})
    assert line.startswith(f"ragpulse serve: environment {variable}: ")
    assert SECRET not in line and "0123456789" not in line
    assert "(value not shown)" in line
