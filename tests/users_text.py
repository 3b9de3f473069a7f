"""Events whose users' text can be found again: for tests and benchmarks that check where that
text goes (logs, outputs). Each event's question, answer and passage carry words of their own
(`w<i>q...`, not in any prompt file or log format) and planted PII.

    events, words, pii = planted_events(40)
"""

from __future__ import annotations

import orjson

from ragpulse.pipeline.windows import isoformat_utc

T0 = 1_763_632_800.0


def planted_events(n: int) -> tuple[list[bytes], list[str], list[str]]:
    """(the events' payloads, every word of users' text planted in them, the PII planted)."""
    events: list[bytes] = []
    words: list[str] = []
    pii: list[str] = []
    for i in range(n):
        q, a, c = f"zqvq{i:04d}kx", f"zqva{i:04d}kx", f"zqvc{i:04d}kx"
        mail, phone = f"user{i:04d}@example-shop.com", f"+44 20 7946 {i:04d}"
        words += [q, a, c]
        pii += [mail, phone]
        events.append(orjson.dumps({
            "request_id": f"req-{i}",
            "timestamp": isoformat_utc(T0 + i),
            "app": "hr-assistant",
            "model": "gpt-4o-mini",
            "request": f"Please reset the {q} account, mail {mail} or call {phone}.",
            "response": f"The {a} account is reset; a link went to {mail}.",
            "retrieved_context": [{"content": f"Accounts such as {c} are reset from settings."}],
        }))
    return events, words, pii
