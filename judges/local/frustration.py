"""Offline user_frustration session judge: lexical signs that a user was frustrated.

For operators who want a free, deterministic signal on whole conversations (judges.sessions).
"no" (the user was frustrated) on any of three signs, each named in the rationale:
  * negative feedback on a turn (the event's `feedback`, e.g. "negative", "thumbs_down");
  * a user turn after the first matching judges/lexicons/frustration.txt ("that's wrong",
    "not what I asked", "I already told you", "let me talk to a human", ...);
  * a repeated question: a user turn whose content-word stems mostly repeat an earlier turn's
    (Jaccard similarity >= `repeat_similarity`), asked again because it was not answered.
"yes" otherwise. It reads the transcript a session judge gets (`transcript_input`).
"""

from __future__ import annotations

import dataclasses
import functools
import re

from ragpulse.judges.base import JudgeInput, Rating
from ragpulse.judges.local.judge import LocalJudge
from ragpulse.judges.local.text import content_stems, load_lexicon

DEFAULT_REPEAT_SIMILARITY = 0.7
# Feedback labels that say the user disliked an answer (the event's `feedback`, lower-cased).
NEGATIVE_FEEDBACK = frozenset(
    {"negative", "thumbs_down", "thumbs-down", "thumbsdown", "dislike", "disliked", "bad",
     "-1", "unhelpful", "not_helpful", "wrong", "\N{THUMBS DOWN SIGN}"}
)
# A question of fewer content words than this is not compared ("why?", "and then?").
_MIN_REPEAT_WORDS = 3


@functools.cache
def _frustration_re() -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in load_lexicon("frustration")), re.IGNORECASE)


def frustration_signs(item: JudgeInput, repeat_similarity: float = DEFAULT_REPEAT_SIMILARITY
                      ) -> list[str]:
    """The signs of frustration in a session's transcript, one phrase each, in turn order
    (pure)."""
    signs: list[str] = []
    asked: list[set[str]] = []
    turn = 0
    for message in item.history:
        if message.role == "feedback":
            if message.content.strip().lower() in NEGATIVE_FEEDBACK:
                signs.append(f"negative feedback on turn {turn}")
            continue
        if message.role != "user":
            continue
        turn += 1
        if turn > 1:
            found = _frustration_re().search(message.content)
            if found:
                signs.append(f"turn {turn} says {found.group(0)!r}")
        stems = set(content_stems(message.content))
        if len(stems) >= _MIN_REPEAT_WORDS:
            for earlier, before in enumerate(asked, start=1):
                if len(before) >= _MIN_REPEAT_WORDS and (
                    len(stems & before) / len(stems | before) >= repeat_similarity
                ):
                    signs.append(f"turn {turn} repeats turn {earlier}")
                    break
        asked.append(stems)
    return signs


@dataclasses.dataclass(frozen=True, kw_only=True)
class UserFrustrationJudge(LocalJudge):
    """Local `user_frustration` session judge: "no" when the transcript shows frustration."""

    name = "user_frustration"

    repeat_similarity: float = DEFAULT_REPEAT_SIMILARITY

    def decide(self, item: JudgeInput) -> tuple[Rating, str]:
        signs = frustration_signs(item, self.repeat_similarity)
        if signs:
            return "no", f"The user shows frustration: {'; '.join(signs[:4])}."
        turns = sum(m.role == "user" for m in item.history)
        return "yes", (
            f"No sign of frustration in {turns} turn(s): no negative feedback, no complaint, "
            "no repeated request."
        )
