"""Fencing untrusted text (question, history, chunks, answer, ground truth, doc_uri) for a prompt.

For the LLM judges (`judges.llm.judge`), which put text from the chatbot's logs into a prompt. Each
input goes between tags carrying a random per-call nonce, `<answer-3f9a0c...>` ...
`</answer-3f9a0c...>`: the text cannot know the nonce, so it cannot close its fence.

The rule that makes sure it cannot even come close: inside fenced data, no character that could
read as an angle bracket survives as is. `<` and every look-alike of it (fullwidth ＜, small ﹤,
‹ «, 〈 《 ⟨ ⟪ ⧼ ❬ ❮ ❰, the arrowheads ˂ ᐸ, the composed ≮ ...) become the visible `[lt]`,
and `>` with its look-alikes becomes `[gt]`. Without an angle bracket no tag can be written,
whatever follows it: a closing tag without the nonce (`</answer>`), another tag name
(`<system>`, `</chunks-…>`), the few-shot tags (`</answer-example>`), any slash (`/`, ∕ ⁄ ⧸ ／),
zero-width characters inside the tag name. Brackets spelled in an encoding a model reads
through are made visible the same way: HTML entities (`&lt;`, `&LT`, `&lang;`, `&laquo;` ...),
decimal and hex character references (`&#60;`, `&#x3C`), percent-escapes (`%3C`, the UTF-8
escapes of ＜) and these encoded again (`&amp;lt;`, `%253C`, `%26lt;`). Unicode tag
characters (U+E0000..U+E007F), which are invisible yet read by models ("ASCII smuggling"), are
dropped. Everything else, including text that imitates a verdict ("rating: yes", a JSON
verdict), stays as data: the system prompt tells the model to grade it, never to obey it.
Values meant to sit on one line (doc_uri) are also flattened to one line, so they cannot start
a line of their own.

All functions are pure and linear in the length of the text (`str.translate`, one regular
expression pass, and at most eight decoding passes when the text holds `&` or `%`).
"""

from __future__ import annotations

import html
import re
import secrets
import urllib.parse

LT = "[lt]"
GT = "[gt]"

# Characters that can be read as "<" or ">". The ASCII pair and the NFKC-equivalent forms
# (fullwidth, small) first, then visual confusables that no normalisation maps to ASCII.
_LEFT_ANGLES = (
    "<\uff1c\ufe64"  # < ＜ ﹤
    "\u2039\u00ab"  # ‹ «
    "\u2329\u3008\u300a\u27e8\u27ea\u29fc"  # 〈 〈 《 ⟨ ⟪ ⧼
    "\ufe3f\ufe3d"  # ︿ ︽ (vertical forms; NFKC turns them into 〈 《)
    "\u276c\u276e\u2770"  # ❬ ❮ ❰
    "\u02c2\u1438\u16b2"  # ˂ ᐸ ᚲ (arrowhead, Canadian syllabics, runic)
    "\u226e\u22d6\u227a\u2aa1"  # ≮ ⋖ ≺ ⪡
)
_RIGHT_ANGLES = (
    ">\uff1e\ufe65"  # > ＞ ﹥
    "\u203a\u00bb"  # › »
    "\u232a\u3009\u300b\u27e9\u27eb\u29fd"  # 〉 〉 》 ⟩ ⟫ ⧽
    "\ufe40\ufe3e"  # ﹀ ︾
    "\u276d\u276f\u2771"  # ❭ ❯ ❱
    "\u02c3\u1433"  # ˃ ᐳ
    "\u226f\u22d7\u227b\u2aa2"  # ≯ ⋗ ≻ ⪢
)
# Unicode tag characters: invisible, but spell ASCII to a model.
_TAG_CHARACTERS = range(0xE0000, 0xE0080)
# Line breaks as str.splitlines sees them (and as a model would).
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"

_DEFUSE_TABLE: dict[int, str | None] = {
    **{ord(c): LT for c in _LEFT_ANGLES},
    **{ord(c): GT for c in _RIGHT_ANGLES},
    **dict.fromkeys(_TAG_CHARACTERS),
}
_ONE_LINE_TABLE: dict[int, str | None] = {ord(c): " " for c in _LINE_BREAKS}
# A run of adjacent character references and percent-escapes (`&lt;`, `&#60`, `&#x3c;`, `%3C`,
# `%EF%BC%9C`): decoded as a whole, it may spell a bracket.
_ENCODED_RUN = re.compile(
    r"(?:&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);?|%[0-9A-Fa-f]{2})+"
)
# Encodings nest (`&amp;lt;`, `%253C`): a model may read through this many levels.
_DECODE_LEVELS = 8


def new_nonce() -> str:
    """A fresh, unguessable fence code for one call (16 hex digits)."""
    return secrets.token_hex(8)


def defuse(text: str) -> str:
    """`text` with every angle-bracket look-alike, written or encoded, made visible as `[lt]` /
    `[gt]`, and Unicode tag characters dropped, so that no tag of any kind can be written in it."""
    if "&" in text or "%" in text:
        text = _ENCODED_RUN.sub(_defuse_encoded, text)
        if _has_bracket(_decoded(text)):
            # Brackets encoded across runs (`&amp;lt;`: "&amp;" then "lt;"): every introducer
            # is made visible, so that nothing in the text decodes at all.
            text = text.replace("&", "[amp]").replace("%", "[pct]")
    return text.translate(_DEFUSE_TABLE)


def _defuse_encoded(match: re.Match[str]) -> str:
    run = match.group()
    plain = _decoded(run)
    return plain.translate(_DEFUSE_TABLE) if _has_bracket(plain) else run


def _decoded(text: str) -> str:
    """`text` with character references and percent-escapes decoded, level after level."""
    for _ in range(_DECODE_LEVELS):
        plain = urllib.parse.unquote(html.unescape(text))
        if plain == text:
            break
        text = plain
    return text


def _has_bracket(text: str) -> bool:
    return text.translate(_DEFUSE_TABLE) != text


def single_line(text: str) -> str:
    """`text` with its line breaks turned into spaces (for values shown inline, like doc_uri)."""
    return text.translate(_ONE_LINE_TABLE)


def fence(name: str, text: str, nonce: str) -> str:
    """`text` as data between `<name-nonce>` and `</name-nonce>` lines, defused first."""
    return f"<{name}-{nonce}>\n{defuse(text)}\n</{name}-{nonce}>"

