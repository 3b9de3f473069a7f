"""Probabilities from token log-probabilities: P(yes) of a binary verdict, the expected score
of a graded one.

For `--judge-logprobs`: an OpenAI-compatible endpoint asked for `logprobs` (with
`top_logprobs`) returns, for each token of the reply, its log-probability and the most likely
alternatives at that place. The verdict's rating is one token of the reply (`yes` after
`rating`, a digit after `score`); the alternatives at that token say how sure the model was:
P(yes) = p(yes) / (p(yes) + p(no)) over the alternatives that spell either word, and on a
graded scale the expected score = sum(s * p(s)) / sum(p(s)) over the alternatives that are
scores of the scale. The verdict's `score` then carries that number (its rating stays the
reply's word).

Read leniently: a reply without logprobs, or with logprobs of another shape, or where the
rating token cannot be found among them, gives None, and the verdict is as without the flag.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence

__all__ = ["TOP_LOGPROBS", "TokenLogprob", "expected_score", "probability_of_yes", "read_logprobs"]

# Alternatives asked for per token: enough to hold both words (or every score of a 1-5 scale).
TOP_LOGPROBS = 5
# How many tokens after the `rating` / `score` key the value may come (quotes, colon, space).
_LOOKAHEAD = 6
_WORD = re.compile(r"[^A-Za-z0-9]+")


@dataclasses.dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One reply token, its log-probability, and the alternatives at its place."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


def read_logprobs(raw: object) -> tuple[tuple[TokenLogprob, ...] | None, str | None]:
    """The tokens of a choice's `logprobs` (`{"content": [{"token", "logprob",
    "top_logprobs": [{"token", "logprob"}]}]}`), and what was wrong with it, if anything.
    (None, None) when there are none; (None, reason) when they are malformed."""
    if raw is None:
        return None, None
    content = raw.get("content") if isinstance(raw, Mapping) else None
    if not isinstance(content, list):
        return None, "logprobs.content is not a list"
    tokens = []
    for i, item in enumerate(content):
        token = _token(item)
        if token is None:
            return None, f"logprobs.content[{i}] is not a token with a finite logprob <= 0"
        tops = item.get("top_logprobs") or []
        if not isinstance(tops, list):
            return None, f"logprobs.content[{i}].top_logprobs is not a list"
        alternatives = [_token(t) for t in tops]
        if any(a is None for a in alternatives):
            return None, f"logprobs.content[{i}].top_logprobs holds a malformed token"
        tokens.append(TokenLogprob(token[0], token[1],
                                   tuple(a for a in alternatives if a is not None)))
    return tuple(tokens), None


def _token(item: object) -> tuple[str, float] | None:
    if not isinstance(item, Mapping):
        return None
    token, logprob = item.get("token"), item.get("logprob")
    if not isinstance(token, str) or isinstance(logprob, bool):
        return None
    if not isinstance(logprob, int | float) or not math.isfinite(logprob) or logprob > 1e-6:
        return None
    return token, float(logprob)


def _norm(token: str) -> str:
    return _WORD.sub("", token).lower()


def _value_token(tokens: Sequence[TokenLogprob], key: str,
                 accepted: Mapping[str, float]) -> TokenLogprob | None:
    """The token giving the value of `key` (`rating`, `score`): the first token within a few
    after the last one naming the key whose text is an accepted value."""
    keyed = [i for i, t in enumerate(tokens) if key in t.token.lower()]
    if not keyed:
        return None
    start = keyed[-1] + 1
    for t in tokens[start : start + _LOOKAHEAD]:
        if _norm(t.token) in accepted:
            return t
    return None


def _weights(token: TokenLogprob, accepted: Mapping[str, float]) -> dict[float, float]:
    """The probability mass of each accepted value among the token's alternatives (the token
    itself counted when the endpoint did not list it among them)."""
    mass: dict[float, float] = {}
    seen: set[str] = set()
    for text, logprob in (*token.top, (token.token, token.logprob)):
        value = accepted.get(_norm(text))
        if value is None or text in seen:
            continue
        seen.add(text)
        mass[value] = mass.get(value, 0.0) + math.exp(logprob)
    return mass


def probability_of_yes(tokens: Sequence[TokenLogprob], rating: str) -> float | None:
    """P(yes) at the reply's rating token, or None when the rating token (which must spell
    `rating`) cannot be found."""
    words = {"yes": 1.0, "no": 0.0}
    token = _value_token(tokens, "rating", words)
    if token is None or _norm(token.token) != rating:
        return None
    mass = _weights(token, words)
    total = sum(mass.values())
    return mass.get(1.0, 0.0) / total if total > 0 else None


def expected_score(tokens: Sequence[TokenLogprob], scores: Sequence[int],
                   score: int) -> float | None:
    """The expected score at the reply's score token (which must spell `score`), or None."""
    accepted = {str(s): float(s) for s in scores}
    token = _value_token(tokens, "score", accepted)
    if token is None or _norm(token.token) != str(score):
        return None
    mass = _weights(token, accepted)
    total = sum(mass.values())
    return sum(s * p for s, p in mass.items()) / total if total > 0 else None
