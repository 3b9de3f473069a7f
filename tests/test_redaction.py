"""PII redaction: what is replaced, what is left alone, and that nothing planted reaches a judge
endpoint or a stored verdict row unless the operator says so."""

from __future__ import annotations

import argparse
import io
import json
import logging
from pathlib import Path

import orjson
import pytest
from fake_openai import FakeOpenAI, fake_openai_fixture  # noqa: F401

from ragpulse.judges import TextPolicy
from ragpulse.judges.base import Chunk, Guideline, JudgeInput, ToolCall, Turn, Verdict
from ragpulse.judges.llm.judge import available_prompts
from ragpulse.judges.redaction import (
    Redactor,
    compile_user_patterns,
    iban_valid,
    is_loopback_url,
    luhn_valid,
)
from ragpulse.pipeline.cli import main
from ragpulse.pipeline.formats.verdict_rows import verdict_row
from ragpulse.pipeline.records import InferenceRecord, JudgedEvent
from ragpulse.pipeline.settings.command_flags import add_judge_arguments, judge_settings
from ragpulse.pipeline.settings.models import JudgeSettings, SettingsError

# (planted item, placeholder): one of each kind the redactor knows.
PLANTED: list[tuple[str, str]] = [
    ("jane.doe+billing@example.co.uk", "[EMAIL]"),
    ("J.Smith@Mail.Example.com", "[EMAIL]"),
    ("+44 20 7946 0958", "[PHONE]"),
    ("+1 (415) 555-0132", "[PHONE]"),
    ("+33612345678", "[PHONE]"),
    ("(415) 555-0199", "[PHONE]"),
    ("415-555-0173", "[PHONE]"),
    ("1-800-555-0100", "[PHONE]"),
    ("020 7946 0321", "[PHONE]"),
    ("06 12 34 56 78", "[PHONE]"),
    ("030/12345678", "[PHONE]"),
    ("4111 1111 1111 1111", "[CARD]"),
    ("5500-0000-0000-0004", "[CARD]"),
    ("378282246310005", "[CARD]"),
    ("6011000990139424", "[CARD]"),
    ("DE89 3704 0044 0532 0130 00", "[IBAN]"),
    ("GB82WEST12345698765432", "[IBAN]"),
    ("FR14 2004 1010 0505 0001 3M02 606", "[IBAN]"),
    ("NL91ABNA0417164300", "[IBAN]"),
    ("192.168.10.42", "[IP]"),
    ("2001:db8:85a3::8a2e:370:7334", "[IP]"),
    ("fe80::1ff:fe23:4567:890a", "[IP]"),
    ("sk-proj-Xy12ab34cd56ef78gh90ij12kl34", "[API_KEY]"),
    ("AKIAIOSFODNN7EXAMPLE", "[API_KEY]"),
    ("AIzaSyD4f8Kq2X9vB7nL0pQ3rT6uW1yZ5aC8eG0", "[API_KEY]"),
    ("ghp_16C7e42F292c6912E7710c838347Ae178B4a", "[API_KEY]"),
    ("xoxb-2634178-82461978-AbCdEfGhIjKlMnOp", "[API_KEY]"),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dBjftJeZ4CVPmB92K27uhbUJU", "[TOKEN]"),
]  # fmt: skip
# Items planted behind a label that is kept ("Bearer ...", "password=..."): the value goes.
LABELLED: list[tuple[str, str, str]] = [
    ("Authorization: Bearer ", "a1b2c3d4e5f6g7h8i9j0k1l2", "[TOKEN]"),
    ("password=", "Hunter2Hunter2!", "[TOKEN]"),
    ("phone: ", "5551234567", "[PHONE]"),
]


def redact(text: str) -> str:
    return Redactor().redact(text)


@pytest.mark.parametrize(("item", "placeholder"), PLANTED)
def test_each_kind_of_pii_becomes_its_typed_placeholder(item: str, placeholder: str) -> None:
    assert redact(f"Contact: {item}.") == f"Contact: {placeholder}."


@pytest.mark.parametrize(("label", "item", "placeholder"), LABELLED)
def test_labelled_secrets_lose_their_value_and_keep_the_label(
    label: str, item: str, placeholder: str
) -> None:
    assert redact(f"{label}{item} ok") == f"{label}{placeholder} ok"


@pytest.mark.parametrize(
    "text",
    [
        "Refunds take 30 days; the office opened in 1998 and has 1,250 staff.",
        "The meeting is on 2024-01-15 at 10:30:45, or 15.01.2024.",
        "Last updated on: 01/28/2015 11:52:29 by 05.10.2023 12",
        "Version 1.2.3 costs $1,299.99 and pi is 3.14159265358979.",
        "The card 4111 1111 1111 1112 fails the Luhn check.",
        "DE89 3704 0044 0532 0130 01 has a wrong checksum.",
        "Use std::vector and a::b in C++; call 911 in an emergency.",
        "The password: must be long enough.",
        "About 8000000000 people and 7 billion phones.",
    ],
)
def test_ordinary_numbers_dates_versions_and_invalid_items_are_left_alone(text: str) -> None:
    assert redact(text) == text


def test_a_card_followed_by_more_digits_still_loses_the_card_number() -> None:
    assert redact("card 4111 1111 1111 1111 123") == "card [CARD] 123"


def test_the_checksums_are_the_published_ones() -> None:
    assert luhn_valid("79927398713") and not luhn_valid("79927398710")
    assert iban_valid("GB82WEST12345698765432") and not iban_valid("GB82WEST12345698765433")


def test_operator_patterns_are_applied_after_the_built_in_ones() -> None:
    r = Redactor([r"EMP-\d{6}", r"(?i)project falcon"])
    assert r.redact("EMP-123456 works on Project Falcon") == "[REDACTED] works on [REDACTED]"


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(unclosed", "is not a valid regex"),
        ("x*", "matches empty text"),
        (r"(a+)+b", "nests a repetition inside an unbounded one"),
        (r"(?:\w+\s?)*@", "nests a repetition inside an unbounded one"),
    ],
)
def test_unusable_operator_patterns_are_refused_naming_the_pattern(pattern: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as info:
        compile_user_patterns(["ok-\\d+", pattern])
    assert repr(pattern) in str(info.value)


def test_a_bad_redact_pattern_flag_is_a_one_line_settings_error() -> None:
    parser = argparse.ArgumentParser()
    add_judge_arguments(parser)
    args = parser.parse_args(["--redact-pattern", "ok", "--redact-pattern", "(a+)+"])
    with pytest.raises(SettingsError) as info:
        judge_settings(args, env={})
    assert "'(a+)+'" in str(info.value) and "\n" not in str(info.value)


def test_the_flags_reach_the_judge_spec_and_default_to_auto_and_redacted() -> None:
    parser = argparse.ArgumentParser()
    add_judge_arguments(parser)
    default = judge_settings(parser.parse_args([]), env={}).spec().text_policy
    assert default == TextPolicy("auto", (), "redacted")
    args = parser.parse_args(
        ["--redact-pii", "off", "--redact-pattern", r"EMP-\d+", "--store-text", "none"]
    )
    assert judge_settings(args, env={}).spec().text_policy == TextPolicy(
        "off", (r"EMP-\d+",), "none"
    )


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://localhost:8000/v1", True),
        ("http://127.0.0.1:8000/v1", True),
        ("http://127.8.9.10/v1", True),
        ("http://[::1]:11434/v1", True),
        ("http://api.localhost/v1", True),
        ("https://api.openai.com/v1", False),
        ("http://10.0.0.5:8000/v1", False),
        ("http://localhost.example.com/v1", False),
        (None, False),
    ],
)
def test_only_loopback_endpoints_count_as_local(url: str | None, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


def test_auto_redacts_unless_the_endpoint_is_marked_trusted_and_on_and_off_mean_what_they_say(
) -> None:
    assert TextPolicy("auto").redacts_prompts is True
    assert TextPolicy("auto", endpoint_trusted=True).redacts_prompts is False
    assert TextPolicy("on").redacts_prompts is True
    assert TextPolicy("off").redacts_prompts is False


def pii_events() -> list[JudgeInput]:
    """One event carrying every planted item in every field a prompt shows (tool calls too)."""
    items = " ; ".join([item for item, _ in PLANTED] + [lb + it for lb, it, _ in LABELLED])
    return [
        JudgeInput(
            question=f"Are these on file? {items}",
            answer=f"Yes: {items} are on file.",
            chunks=(Chunk(f"Record: {items}", f"crm://{items}"),),
            history=(Turn("user", f"My details: {items}"),),
            expected_response=f"They are: {items}",
            guidelines=(Guideline("privacy", (f"Never repeat {items}",)),),
            tool_calls=(
                ToolCall("lookup_customer", f'{{"query": "{items}"}}', f"Found {items}",
                         description=f"Looks customers up, e.g. {items}"),
                ToolCall("email_customer", f'{{"to": "{items}"}}', status="error",
                         error=f"mailbox {items} is full"),
            ),
        )
    ]


def sent_to(server: FakeOpenAI, redact_pii: str, *, trusted: bool = False) -> str:
    """Everything the judge endpoint received for the PII events, as one string."""
    spec = JudgeSettings(
        backend="openai",
        base_url=server.base_url,
        redact_pii=redact_pii,
        endpoint_trusted=trusted,
        names=available_prompts(),  # every judge, so every field a prompt shows is sent
    ).spec()
    panel = spec.build()
    try:
        panel.judge_batch(pii_events())
    finally:
        panel.close()
    # One call per judge (chunk_relevance: per chunk, and the event has one).
    assert len(server.requests) == len(available_prompts()) * len(pii_events())
    return "\n".join(json.dumps(r.body, ensure_ascii=False) for r in server.requests)


def planted_values() -> list[str]:
    return [item for item, _ in PLANTED] + [item for _, item, _ in LABELLED]


def test_no_planted_pii_reaches_the_judge_endpoint_with_redaction_on(
    fake_openai: FakeOpenAI,
) -> None:
    received = sent_to(fake_openai, "on")
    leaked = [item for item in planted_values() if json.dumps(item)[1:-1] in received]
    assert leaked == []
    assert "[EMAIL]" in received and "[IBAN]" in received and "[API_KEY]" in received
    # The ground truth is redacted too, not dropped: the judges that read it still see it.
    assert "They are: [EMAIL]" in received and "Never repeat [EMAIL]" in received


def test_every_planted_item_reaches_the_endpoint_with_redaction_off(
    fake_openai: FakeOpenAI,
) -> None:
    # The same check can fail: without redaction every item is in the requests.
    received = sent_to(fake_openai, "off")
    assert all(json.dumps(item)[1:-1] in received for item in planted_values())


def test_auto_redacts_for_a_loopback_endpoint_which_may_be_a_proxy_to_a_hosted_model(
    fake_openai: FakeOpenAI,
) -> None:
    received = sent_to(fake_openai, "auto")  # the stand-in listens on 127.0.0.1
    assert [item for item in planted_values() if json.dumps(item)[1:-1] in received] == []
    assert "[EMAIL]" in received


def test_auto_sends_raw_text_to_an_endpoint_the_operator_marked_trusted(
    fake_openai: FakeOpenAI,
) -> None:
    received = sent_to(fake_openai, "auto", trusted=True)
    assert "jane.doe+billing@example.co.uk" in received


def judge_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_judge_arguments(parser)
    return parser.parse_args(["--judge-backend", "openai", *flags])


@pytest.mark.parametrize(
    "flags", [("--redact-pii", "off"), ("--redact-pii", "auto", "--judge-endpoint-trusted")]
)
def test_raw_text_to_the_endpoint_is_logged_at_warning_with_the_endpoint_but_not_its_password(
    caplog: pytest.LogCaptureFixture, flags: tuple[str, ...]
) -> None:
    env = {"OPENAI_BASE_URL": "http://judge:s3cret@127.0.0.1:8080/v1?key=k3y"}
    with caplog.at_level("INFO", logger="ragpulse.pipeline.settings.models"):
        judge_settings(judge_args(*flags), env=env)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "http://127.0.0.1:8080/v1" in warnings[0]
    assert "off" in warnings[0]
    assert "s3cret" not in caplog.text and "k3y" not in caplog.text


def test_auto_on_a_loopback_endpoint_redacts_and_warns_of_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:8080/v1"}
    with caplog.at_level("INFO", logger="ragpulse.pipeline.settings.models"):
        settings = judge_settings(judge_args(), env=env)
    assert settings.text_policy().redacts_prompts
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert "--judge-endpoint-trusted" in caplog.text  # the way to send raw text, if meant


def test_judge_endpoint_trusted_without_auto_is_refused_in_one_line() -> None:
    with pytest.raises(SettingsError) as info:
        judge_settings(
            judge_args("--redact-pii", "on", "--judge-endpoint-trusted"),
            env={"OPENAI_BASE_URL": "http://127.0.0.1:8080/v1"},
        )
    assert "--judge-endpoint-trusted" in str(info.value) and "\n" not in str(info.value)


# -- stored text -------------------------------------------------------------------------------


def judged(*verdicts: Verdict) -> JudgedEvent:
    item = JudgeInput("q", "a")
    return JudgedEvent(InferenceRecord("req-1", 1_763_632_800.0, "app", "m", item), verdicts)


EVENT = judged(
    Verdict("groundedness", "no", "The claim 'mail jane@example.com' is unsupported."),
    Verdict(
        "safety",
        "error",
        error_message="judge reply could not be parsed; reply began 'jane@example.com'",
        error_cause="unparsable",
    ),
)


def test_stored_rows_keep_full_text_only_when_asked() -> None:
    row = verdict_row(EVENT, TextPolicy(store_text="full"))
    assert "jane@example.com" in row["response/llm_judged/groundedness/rationale"]
    assert "jane@example.com" in row["response/llm_judged/safety/error_message"]


def test_stored_rows_redact_rationales_and_error_messages_by_default() -> None:
    row = verdict_row(EVENT, TextPolicy())
    assert row["response/llm_judged/groundedness/rationale"] == (
        "The claim 'mail [EMAIL]' is unsupported."
    )
    assert "[EMAIL]" in row["response/llm_judged/safety/error_message"]
    assert "jane@example.com" not in orjson.dumps(row).decode()


def test_stored_rows_with_no_text_keep_ratings_and_only_the_error_cause() -> None:
    row = verdict_row(EVENT, TextPolicy(store_text="none"))
    assert row["response/llm_judged/groundedness/rating"] == "no"
    assert row["response/llm_judged/groundedness/rationale"] is None
    assert row["response/llm_judged/safety/rating"] == "error"
    assert row["response/llm_judged/safety/error_message"].startswith("unparsable")
    assert "jane@example.com" not in orjson.dumps(row).decode()
    assert row["request_id"] == "req-1" and row["app"] == "app"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "redacted", "none"])
def test_ragpulse_run_writes_verdict_text_as_store_text_says(tmp_path: Path, mode: str) -> None:
    event = {
        "request_id": "req-1",
        "timestamp": 1_763_632_800_000,
        "app": "help-bot",
        "model": "m1",
        "request": {"messages": [{"role": "user", "content": "How do I get a refund?"}]},
        "response": "Write to refunds.team@globex.example within 90 days.",
        "retrieved_context": [{"content": "Refunds are accepted within 30 days.", "doc_uri": "kb"}],
    }
    src = tmp_path / "events.jsonl"
    src.write_bytes(orjson.dumps(event) + b"\n")
    out = tmp_path / "out"
    argv = ["run", str(src), "--output", str(out), "--judge-backend", "local"]
    assert main([*argv, "--judges", "groundedness", "--store-text", mode]) == 0
    row = orjson.loads((out / "verdicts.jsonl").read_bytes())
    rationale = row["response/llm_judged/groundedness/rationale"]
    assert row["response/llm_judged/groundedness/rating"] == "no"
    if mode == "full":
        assert "refunds.team@globex.example" in rationale
    elif mode == "redacted":
        assert "[EMAIL]" in rationale and "globex" not in rationale
    else:
        assert rationale is None



# The libraries known to log what they carry at DEBUG, and one no list names (a library added
# later): DEBUG is ragpulse's own, whatever the library.
LIBRARIES = ("kafka", "openai", "httpx", "httpx2", "httpcore", "urllib3", "a_library_added_later",
             "ragpulse")


def test_at_debug_the_libraries_that_log_what_they_carry_stay_at_info(tmp_path: Path) -> None:
    """kafka-python logs every request and response at DEBUG (kafka/net/connection.py: the
    fetched events' records, the verdicts produced): serve at --log-level DEBUG printed planted
    PII 380 times in one run. ragpulse's own DEBUG lines carry no user text and stay on; every
    other logger stays at INFO, named in a list or not."""
    root = logging.getLogger()
    saved = root.level, root.handlers[:], {n: logging.getLogger(n).level for n in LIBRARIES}
    stream = io.StringIO()
    try:
        # Any command sets the logging up; this one stops at its missing state file.
        assert main(["--log-level", "DEBUG", "windows", "--state", str(tmp_path / "none")]) == 2
        root.addHandler(logging.StreamHandler(stream))
        items = " ; ".join(planted_values())
        # The lines these libraries write at DEBUG, with what they carry.
        logging.getLogger("kafka.net.connection").debug(
            "%s: Response %d (%s ms): %s", "<BrokerConnection>", 7, 1.5, {"records": items}
        )
        logging.getLogger("openai._base_client").debug("Request options: %s", {"json": items})
        logging.getLogger("a_library_added_later.client").debug("sent %s", items)
        logging.getLogger("ragpulse.pipeline.service").debug("a line of ragpulse's own")
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        for name, level in saved[2].items():
            logging.getLogger(name).setLevel(level)
    logged = stream.getvalue()
    assert "a line of ragpulse's own" in logged  # DEBUG is on
    assert [item for item in planted_values() if item in logged] == []
