"""PII and secret redaction of user text, before it leaves the process.

For the LLM judges (prompts sent to an endpoint that is not on this machine) and for stored
verdicts (rationales and error messages quote the answer). Planted items become typed
placeholders:

    [EMAIL]    e-mail addresses
    [PHONE]    phone numbers: international (+CC ...), North American ((555) 123-4567,
               555-123-4567), national with a trunk 0 (020 7946 0958, 06 12 34 56 78), and any
               7-15 digit number right after "phone", "tel", "mobile", "fax", "call" ...
    [CARD]     payment card numbers: 13-19 digits, spaces or dashes allowed, Luhn-checked
    [IBAN]     IBANs, length per country and mod-97 checksum validated
    [IP]       IPv4 and IPv6 addresses
    [API_KEY]  OpenAI sk-..., AWS AKIA/ASIA..., GCP AIza..., GitHub ghp_/github_pat_...,
               Slack xox...
    [TOKEN]    JWTs, the token of "Bearer <token>", the value of "password=...", "api_key: ..."
    [REDACTED] matches of the operator's own patterns (--redact-pattern)

Everything is pure, and linear in the length of the text: every built-in pattern starts where
the previous character cannot continue it (a look-behind), and its repetitions are bounded or
possessive, so the regex engine never re-scans a run of characters from each of its positions.
Operators' patterns are checked at start-up (`compile_user_patterns`): invalid ones, ones that
match empty text and ones that nest a repetition in an unbounded repetition (the shape that
backtracks exponentially) are refused with an error naming the pattern.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
import re._parser as sre_parser
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Literal, get_args

from ragpulse.judges.base import Chunk, Guideline, JudgeInput, ToolCall, Turn

RedactMode = Literal["auto", "on", "off"]
StoreText = Literal["none", "redacted", "full"]
REDACT_MODES: tuple[RedactMode, ...] = get_args(RedactMode)
STORE_TEXT_MODES: tuple[StoreText, ...] = get_args(StoreText)

# How one match is replaced: the replacement text, or None to leave the match as it is.
_Validate = Callable[[re.Match[str]], str | None]


@dataclasses.dataclass(frozen=True, slots=True)
class _Detector:
    placeholder: str
    regex: re.Pattern[str]
    validate: _Validate | None = None
    # A cheap pre-check: the pass is skipped unless one of these occurs in the text (in the
    # lower-cased text when `folded`). Most texts hold no "@", "+", ":", "key" ...
    needs: tuple[str, ...] = ()
    folded: bool = False


def _digits(text: str) -> str:
    return "".join(c for c in text if c.isdigit())


def luhn_valid(digits: str) -> bool:
    """Whether a digit string passes the Luhn checksum of payment card numbers."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _windows(text: str, separators: str) -> list[tuple[int, int]]:
    """(start, end) spans of `text` between separator positions, longest first."""
    cuts = [i for i, c in enumerate(text) if c in separators]
    starts = [0, *(i + 1 for i in cuts)]
    ends = [*cuts, len(text)]
    spans = [(s, e) for s in starts for e in ends if e > s]
    return sorted(spans, key=lambda se: se[0] - se[1])


def _replace_window(
    match: re.Match[str], placeholder: str, ok: Callable[[str], bool], separators: str
) -> str | None:
    """The match with its longest separator-aligned window that passes `ok` replaced."""
    text = match.group(0)
    for start, end in _windows(text, separators):
        if ok(text[start:end]):
            return text[:start] + placeholder + text[end:]
    return None


# How card numbers are printed in groups (16 and 19 digits, American Express, Diners, and the
# shorter Visa and Maestro numbers); other groupings of 13-19 digits are not card numbers.
_CARD_LAYOUTS = frozenset(
    {(4, 4, 4, 4), (4, 4, 4, 4, 3), (4, 6, 5), (4, 6, 4), (4, 4, 4, 3), (4, 4, 4, 2), (4, 4, 4, 1)}
)


def _card_number(text: str) -> bool:
    digits = _digits(text)
    if not (13 <= len(digits) <= 19 and digits[0] in "23456" and luhn_valid(digits)):
        return False
    groups = tuple(len(g) for g in re.split(r"[ \-]", text))
    return len(groups) == 1 or groups in _CARD_LAYOUTS


def _card(match: re.Match[str]) -> str | None:
    return _replace_window(match, "[CARD]", _card_number, " -")


# 01/28/2015, 05.10.2023: a date at the start of a number is not a phone number.
_DATE_START = re.compile(r"\d{1,2}([/.\-])\d{1,2}\1\d{2,4}(?!\d)")


def _phone_digits(low: int, high: int) -> _Validate:
    def validate(match: re.Match[str]) -> str | None:
        value = match.group("v") if "v" in match.re.groupindex else match.group(0)
        if not low <= len(_digits(value)) <= high or _DATE_START.match(value):
            return None
        return match.group(0).replace(value, "[PHONE]", 1)

    return validate


def _international_phone(match: re.Match[str]) -> str | None:
    # E.164 allows 15 digits at most; a longer run is a number followed by more digits.
    return _replace_window(match, "[PHONE]", lambda w: 7 <= len(_digits(w)) <= 15, " .-")


# Length of the IBAN of each country of the IBAN registry (SWIFT).
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28,
    "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23,
    "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
    "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20,
    "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18,
    "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24,
    "SC": 31, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28, "TL": 23, "TN": 24,
    "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}  # fmt: skip


def iban_valid(compact: str) -> bool:
    """Whether an IBAN without spaces has its country's length and a valid mod-97 checksum."""
    compact = compact.upper()
    if IBAN_LENGTHS.get(compact[:2]) != len(compact) or not compact.isalnum():
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1


def _iban(match: re.Match[str]) -> str | None:
    text = match.group(0)
    length = IBAN_LENGTHS.get(text[:2].upper())
    if length is None:
        return None
    taken, end = 0, 0
    for end, ch in enumerate(text, start=1):  # noqa: B007 (end is used after the loop)
        taken += ch != " "
        if taken == length:
            break
    rest = text[end:]
    if taken != length or (rest and rest[0] != " "):
        return None  # too short, or more letters and digits run on without a space
    return "[IBAN]" + rest if iban_valid(text[:end].replace(" ", "")) else None


def _ipv6(match: re.Match[str]) -> str | None:
    text = match.group(0)
    if text.count(":") < 2 or sum(c not in ":." for c in text) < 4:
        return None  # "a::b", "::1", clock times
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return None
    return "[IP]"


def _secret_value(match: re.Match[str]) -> str | None:
    value = match.group("v")
    # Prose ("password: must be long") has no digits; keys and passwords mostly do.
    if not any(c.isdigit() for c in value) or not any(c.isalpha() for c in value):
        return None
    return match.group(0).replace(value, "[TOKEN]", 1)


def _token_group(match: re.Match[str]) -> str:
    return match.group(0).replace(match.group("v"), "[TOKEN]", 1)


_DIGITS = tuple("0123456789")
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"

# In order: keys and tokens first (they contain digits that read as phone or card numbers),
# IBANs before cards (an IBAN's digits can pass Luhn), addresses before phone numbers.
_DETECTORS: tuple[_Detector, ...] = (
    _Detector(
        "[API_KEY]",
        re.compile(
            r"(?<![\w-])(?:"
            r"sk-[A-Za-z0-9_\-]{20,}+"  # OpenAI: sk-..., sk-proj-..., sk-svcacct-...
            r"|(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])"  # AWS access key id
            r"|AIza[0-9A-Za-z_\-]{35}(?![\w-])"  # Google Cloud API key
            r"|gh[pousr]_[A-Za-z0-9]{36,255}+"  # GitHub tokens
            r"|github_pat_[A-Za-z0-9_]{22,255}+"
            r"|xox[abposre]-[A-Za-z0-9\-]{10,}+"  # Slack tokens
            r")"
        ),
        needs=("sk-", "AKIA", "ASIA", "ABIA", "ACCA", "AIza", "gh", "xox"),
    ),
    _Detector(
        "[TOKEN]",
        re.compile(
            r"eyJ(?<![\w-]eyJ)[A-Za-z0-9_\-]{8,}+\.eyJ[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]*+"
        ),
        needs=("eyJ",),
    ),
    _Detector(
        "[TOKEN]",
        re.compile(r"(?i:(?<![a-z])bearer)[ \t]++(?P<v>[A-Za-z0-9._~+/\-]{16,}+=*+)"),
        _token_group,
        needs=("bearer",),
        folded=True,
    ),
    _Detector(
        "[TOKEN]",
        re.compile(
            r"(?i:(?<![a-z])(?:api[_-]?key|secret|password|passwd|access[_-]?token|token))"
            r"[\w-]{0,20}+[\"']?+[ \t]{0,3}+[:=][ \t]{0,3}+[\"']?+(?P<v>[^\s\"',;]{8,200}+)"
        ),
        _secret_value,
        needs=("key", "secret", "passw", "token"),
        folded=True,
    ),
    _Detector(
        "[EMAIL]",
        re.compile(
            r"[\w.%+\-](?<![\w.%+\-].)[\w.%+\-]{0,63}@"
            r"(?:[A-Za-z0-9\-]{1,63}+\.(?=[A-Za-z0-9\-])){1,8}+[A-Za-z]{2,63}+(?![\w\-])"
        ),
        needs=("@",),
    ),
    _Detector(
        "[IBAN]",
        re.compile(r"[A-Za-z](?<![A-Za-z0-9].)[A-Za-z]\d{2}(?: ?[A-Za-z0-9]){11,30}"),
        _iban,
        needs=_DIGITS,
    ),
    _Detector(
        "[IP]",
        re.compile(
            r"[0-9A-Fa-f:](?<![\w:.].)[0-9A-Fa-f:]{1,38}+(?:(?<=:)\d{1,3}(?:\.\d{1,3}){3})?"
            r"(?![\w:])"
        ),
        _ipv6,
        needs=(":",),
    ),
    _Detector(
        "[IP]", re.compile(rf"(?<![\w.])(?:{_OCTET}\.){{3}}{_OCTET}(?!\w|\.\d)"), needs=(".",)
    ),
    _Detector(
        "[CARD]",
        re.compile(r"[2-6](?<![\w+.\-][2-6])(?:[ \-]?+\d){12,18}(?!\d)"),
        _card,
        needs=_DIGITS,
    ),
    _Detector(
        "[PHONE]",
        re.compile(r"\+(?<![\w+]\+)[1-9]\d{0,2}+(?:[ .\-]?+\(?+\d++\)?+){1,7}+"),
        _international_phone,
        needs=("+",),
    ),
    _Detector(  # North American: (555) 123-4567, 555-123-4567, 1-800-555-0199
        "[PHONE]",
        re.compile(
            r"(?<![\w+])(?:1[ .\-]?+)?(?:\(\d{3}\)[ .\-]?+|\d{3}[ .\-])\d{3}[ .\-]\d{4}(?!\d)"
        ),
        needs=_DIGITS,
    ),
    _Detector(  # national numbers with a trunk 0: 020 7946 0958, 06 12 34 56 78, 030/1234567
        "[PHONE]",
        re.compile(r"0(?<![\w+.]0)\d{1,4}(?:[ \-/.]\d{2,8}){1,4}(?!\d|\.\d)"),
        _phone_digits(9, 12),
        needs=("0",),
    ),
    _Detector(  # any number right after a word that announces one
        "[PHONE]",
        re.compile(
            r"(?i:(?<![a-z])(?:phone|telephone|tel|mobile|cell|fax|call|whatsapp|sms)s?)\b"
            r"[^\w\n]{0,4}+(?:(?:no|nr|number|us|me|at|on)\b[^\w\n]{0,3}+){0,3}"
            r"(?P<v>\+?\d(?:[ .\-/()]{0,2}\d){6,14})(?!\d)"
        ),
        _phone_digits(7, 15),
        needs=("phone", "tel", "mobile", "cell", "fax", "call", "whatsapp", "sms"),
        folded=True,
    ),
)


def _apply(d: _Detector, text: str) -> str:
    validate = d.validate
    if validate is None:
        return d.regex.sub(d.placeholder, text)
    return d.regex.sub(lambda m: validate(m) or m.group(0), text)


def _unbounded_nesting(items: sre_parser.SubPattern, inside_unbounded: bool) -> bool:
    """Whether a parsed pattern repeats something repeatable inside an unbounded repetition."""
    for op, av in items:
        name = str(op)
        inner = inside_unbounded
        if name in ("MAX_REPEAT", "MIN_REPEAT"):
            _low, high, sub = av
            if inside_unbounded and high > 1:
                return True
            children, inner = [sub], inside_unbounded or high == sre_parser.MAXREPEAT
        elif name == "SUBPATTERN":
            children = [av[-1]]
        elif name == "BRANCH":
            children = av[1]
        elif name in ("ASSERT", "ASSERT_NOT"):
            children = [av[1]]
        else:
            continue  # a leaf, or possessive/atomic: nothing backtracks into it
        if any(_unbounded_nesting(c, inner) for c in children):
            return True
    return False


def compile_user_patterns(patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
    """The operator's extra patterns, compiled; ValueError names the first unusable one."""
    compiled = []
    for pattern in patterns:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"--redact-pattern {pattern!r} is not a valid regex: {exc}") from None
        if regex.fullmatch("") is not None:
            raise ValueError(f"--redact-pattern {pattern!r} matches empty text")
        if _unbounded_nesting(sre_parser.parse(pattern), False):
            raise ValueError(
                f"--redact-pattern {pattern!r} nests a repetition inside an unbounded one, "
                "which can take exponential time; make the outer one possessive (*+, ++) or "
                "use a bounded count ({1,20})"
            )
        compiled.append(regex)
    return tuple(compiled)


class Redactor:
    """Replaces PII and secrets in text with typed placeholders (see the module docstring).

    Results are memoised (bounded): the same chunks and questions recur across events.
    """

    def __init__(self, user_patterns: Sequence[str] = ()) -> None:
        self._user = compile_user_patterns(user_patterns)
        self.redact: Callable[[str], str] = functools.lru_cache(maxsize=4096)(self._redact)

    def _redact(self, text: str) -> str:
        low = text.lower()
        for d in _DETECTORS:
            if not d.needs or any(n in (low if d.folded else text) for n in d.needs):
                text = _apply(d, text)
        for regex in self._user:
            text = regex.sub(lambda m: "[REDACTED]" if m.group(0) else "", text)
        return text

    def judge_input(self, item: JudgeInput) -> JudgeInput:
        """`item` with every text a judge prompt shows redacted (doc_uri values included)."""
        r = self.redact
        return JudgeInput(
            question=r(item.question),
            answer=r(item.answer),
            chunks=tuple(
                Chunk(r(c.content), r(c.doc_uri) if c.doc_uri else c.doc_uri) for c in item.chunks
            ),
            history=tuple(Turn(t.role, r(t.content)) for t in item.history),
            expected_response=r(item.expected_response) if item.expected_response else None,
            expected_facts=tuple(r(f) for f in item.expected_facts),
            expected_chunks=tuple(
                Chunk(r(c.content), r(c.doc_uri) if c.doc_uri else c.doc_uri)
                for c in item.expected_chunks
            ),
            guidelines=tuple(
                Guideline(g.name, tuple(r(rule) for rule in g.rules)) for g in item.guidelines
            ),
            tool_calls=tuple(self._tool_call(c) for c in item.tool_calls),
        )

    def _tool_call(self, call: ToolCall) -> ToolCall:
        # Arguments, results and errors carry the user's data (an order number, an e-mail);
        # the name and description are the developer's, but redacted too: cheap, and a
        # description may quote an example value.
        r = self.redact
        return dataclasses.replace(
            call,
            arguments=r(call.arguments) if call.arguments else call.arguments,
            result=r(call.result) if call.result else call.result,
            error=r(call.error) if call.error else call.error,
            description=r(call.description) if call.description else call.description,
        )


@functools.lru_cache(maxsize=16)
def redactor(user_patterns: tuple[str, ...] = ()) -> Redactor:
    """The shared `Redactor` for these patterns (built once per process)."""
    return Redactor(user_patterns)


def is_loopback_url(base_url: str | None) -> bool:
    """Whether an endpoint URL names this machine (localhost, 127.0.0.0/8, ::1)."""
    if not base_url:
        return False  # the client's default: api.openai.com
    host = urllib.parse.urlsplit(base_url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def endpoint_for_log(base_url: str | None) -> str:
    """`base_url` as a log line may show it: scheme, host, port and path, never a user or query."""
    if not base_url:
        return "https://api.openai.com/v1 (the client's default)"
    parts = urllib.parse.urlsplit(base_url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


@dataclasses.dataclass(frozen=True)
class TextPolicy:
    """Which user text may leave the process, and in which form.

    `redact_pii`: redact prompts sent to the judge endpoint; "auto" redacts unless the operator
    marked the endpoint trusted (`endpoint_trusted`, --judge-endpoint-trusted): a loopback
    address is no proof, since a local proxy may forward to a hosted model. `patterns`: the
    operator's extra patterns (validated here, so a bad one fails at start-up). `store_text`:
    what verdict rows keep of rationales and error messages, which may quote the answer:
    "full", "redacted" (the default) or "none" (ratings only).
    """

    redact_pii: RedactMode = "auto"
    patterns: tuple[str, ...] = ()
    store_text: StoreText = "redacted"
    endpoint_trusted: bool = False

    def __post_init__(self) -> None:
        if self.redact_pii not in REDACT_MODES:
            raise ValueError(f"redact_pii must be one of {REDACT_MODES}, got {self.redact_pii!r}")
        if self.store_text not in STORE_TEXT_MODES:
            raise ValueError(
                f"store_text must be one of {STORE_TEXT_MODES}, got {self.store_text!r}"
            )
        compile_user_patterns(self.patterns)

    @property
    def redacts_prompts(self) -> bool:
        """Whether prompts sent to the judge endpoint are redacted."""
        if self.redact_pii == "auto":
            return not self.endpoint_trusted
        return self.redact_pii == "on"

    def redactor(self) -> Redactor:
        """The redactor of this policy (the built-in detectors plus `patterns`)."""
        return redactor(self.patterns)
