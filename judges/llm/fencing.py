r"""Fencing untrusted text (question, history, chunks, answer, ground truth, doc_uri) for a prompt.

For the LLM judges (`judges.llm.judge`), which put text from the chatbot's logs into a prompt. Each
input goes between tags carrying a random per-call nonce, `<answer-3f9a0c...>` ...
`</answer-3f9a0c...>`: the text cannot know the nonce, so it cannot close its fence.

The rule that makes sure it cannot even come close: inside fenced data, no character that could
read as an angle bracket survives as is. `<` and every look-alike of it (fullwidth ＜, small ﹤,
‹ «, 〈 《 ⟨ ⟪ ⧼ ❬ ❮ ❰, the arrowheads ˂ ˱ ᐸ, the triangles ◁ ◀ ⊲, the composed ≮ ..., and every
character Unicode's confusables list (TR39) maps to `<`) become the visible `[lt]`, and `>` with
its look-alikes becomes `[gt]`. Without an angle bracket no tag can be written, whatever follows
it: a closing tag without the nonce (`</answer>`), another tag name (`<system>`, `</chunks-…>`),
the few-shot tags (`</answer-example>`), any slash (`/`, ∕ ⁄ ⧸ ／), zero-width characters inside
the tag name. Brackets spelled in an encoding a model reads through are made visible the same
way: HTML entities (`&lt;`, `&LT`, `&lang;`, `&laquo;` ...), decimal and hex character references
(`&#60;`, `&#x3C`), percent-escapes (`%3C`, the UTF-8 escapes of ＜), backslash escapes (JSON
`\u003c`, `\x3c`, CSS `\3c`) and all of these nested, decoded to a fixed point (`&amp;lt;`,
`%253C`, `\u005cu003c`, ...); text that still decodes further after 32 levels has every `&`, `%`
and `\` made visible. Unicode tag characters (U+E0000..U+E007F), which are invisible yet read by
models ("ASCII smuggling"), are dropped. Everything else, including text that imitates a verdict
("rating: yes", a JSON verdict), stays as data: the system prompt tells the model to grade it,
never to obey it. Values meant to sit on one line (doc_uri) are also flattened to one line, so
they cannot start a line of their own.

All functions are pure and linear in the length of the text (`str.translate`, one regular
expression pass, and at most 32 decoding passes when the text holds `&`, `%` or a backslash).
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
    "\u02f1\u25c1\u25c0\u25c2\u25c3\u23f4\u2bc7\U0001f780"  # ˱ ◁ ◀ ◂ ◃ ⏴ ⯇ 🞀 (pointing left)
    "\u22b2\u22b4\u22ea\u22ec\u22b0\u2abb\u22de"  # ⊲ ⊴ ⋪ ⋬ ⊰ ⪻ ⋞
    "\u23ea\u23ee"  # ⏪ ⏮
    "\u226a\u22d8\u2af7\u2991\u2993\u29c0"  # ≪ ⋘ ⫷ ⦑ ⦓ ⧀
    "\U0001d236"  # 𝈶 (Greek instrumental notation, a TR39 confusable of <)
)
_RIGHT_ANGLES = (
    ">\uff1e\ufe65"  # > ＞ ﹥
    "\u203a\u00bb"  # › »
    "\u232a\u3009\u300b\u27e9\u27eb\u29fd"  # 〉 〉 》 ⟩ ⟫ ⧽
    "\ufe40\ufe3e"  # ﹀ ︾
    "\u276d\u276f\u2771"  # ❭ ❯ ❱
    "\u02c3\u1433"  # ˃ ᐳ
    "\u226f\u22d7\u227b\u2aa2"  # ≯ ⋗ ≻ ⪢
    "\u02f2\u25b7\u25b6\u25b8\u25b9\u23f5\u2bc8\U0001f782"  # ˲ ▷ ▶ ▸ ▹ ⏵ ⯈ 🞂 (pointing right)
    "\u22b3\u22b5\u22eb\u22ed\u22b1\u2abc\u22df"  # ⊳ ⊵ ⋫ ⋭ ⊱ ⪼ ⋟
    "\u23e9\u23ed\u23ef"  # ⏩ ⏭ ⏯
    "\u226b\u22d9\u2af8\u2992\u2994\u29c1\u2e16"  # ≫ ⋙ ⫸ ⦒ ⦔ ⧁ ⸖
    "\U0001d237\U00016f3f"  # 𝈷 𖼿 (TR39 confusables of >)
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
_BRACKETS_REMOVED: dict[int, str | None] = dict.fromkeys(map(ord, _LEFT_ANGLES + _RIGHT_ANGLES))
_ONE_LINE_TABLE: dict[int, str | None] = {ord(c): " " for c in _LINE_BREAKS}
# Backslash escapes a model reads through: JSON and JavaScript (`\u003c`, `\u{3c}`), Python and C
# (`\x3c`, `\U0000003c`) and CSS (`\3c`, one to six hex digits and an optional space).
_BACKSLASH_ESCAPE = (
    r"\\(?:u\{[0-9A-Fa-f]{1,6}\}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|x[0-9A-Fa-f]{2}"
    r"|[0-9A-Fa-f]{1,6}[ \t]?)"
)
_BACKSLASH_ESCAPES = re.compile(_BACKSLASH_ESCAPE)
# A run of adjacent character references, percent-escapes and backslash escapes (`&lt;`, `&#60`,
# `&#x3c;`, `%3C`, `%EF%BC%9C`, `\u003c`, `\3c`): decoded as a whole, it may spell a bracket.
_ENCODED_RUN = re.compile(
    r"(?:&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);?|%[0-9A-Fa-f]{2}|"
    + _BACKSLASH_ESCAPE
    + ")+"
)
_INTRODUCERS = ("&", "[amp]"), ("%", "[pct]"), ("\\", "[bsl]")
# Encodings nest (`&amp;lt;`, `%253C`, `\u005cu003c`): decoding runs to a fixed point, but at most
# this many levels; text still changing after them is treated as hiding a bracket.
_DECODE_LEVELS = 32


def new_nonce() -> str:
    """A fresh, unguessable fence code for one call (16 hex digits)."""
    return secrets.token_hex(8)


def defuse(text: str) -> str:
    """`text` with every angle-bracket look-alike, written or encoded, made visible as `[lt]` /
    `[gt]`, and Unicode tag characters dropped, so that no tag of any kind can be written in it."""
    if any(introducer in text for introducer, _ in _INTRODUCERS):
        text = _ENCODED_RUN.sub(_defuse_encoded, text)
        plain, settled = _decoded(text)
        if not settled or _bracket_count(plain) > _bracket_count(text):
            # Brackets encoded across runs (`&amp;lt;`: "&amp;" then "lt;"), or nested deeper
            # than the levels decoded: every introducer is made visible, so nothing decodes.
            text = _introducers_shown(text)
    return text.translate(_DEFUSE_TABLE)


def _defuse_encoded(match: re.Match[str]) -> str:
    run = match.group()
    plain, settled = _decoded(run)
    if not settled:
        return _introducers_shown(run)
    return plain.translate(_DEFUSE_TABLE) if _bracket_count(plain) else run


def _introducers_shown(text: str) -> str:
    for introducer, shown in _INTRODUCERS:
        text = text.replace(introducer, shown)
    return text


def _decoded(text: str) -> tuple[str, bool]:
    """`text` with character references, percent-escapes and backslash escapes decoded, level
    after level, and whether it reached a fixed point within `_DECODE_LEVELS` levels."""
    for _ in range(_DECODE_LEVELS):
        plain = urllib.parse.unquote(html.unescape(text))
        if "\\" in plain:
            plain = _BACKSLASH_ESCAPES.sub(_backslash_decoded, plain)
        if plain == text:
            return text, True
        text = plain
    return text, False


def _backslash_decoded(match: re.Match[str]) -> str:
    digits = match.group()[1:].strip(" \t").lstrip("uUx").strip("{}")
    code_point = int(digits, 16)
    return chr(code_point) if code_point <= 0x10FFFF and not 0xD800 <= code_point <= 0xDFFF else ""


def _bracket_count(text: str) -> int:
    return len(text) - len(text.translate(_BRACKETS_REMOVED))


def single_line(text: str) -> str:
    """`text` with its line breaks turned into spaces (for values shown inline, like doc_uri)."""
    return text.translate(_ONE_LINE_TABLE)


def fence(name: str, text: str, nonce: str) -> str:
    """`text` as data between `<name-nonce>` and `</name-nonce>` lines, defused first."""
    return f"<{name}-{nonce}>\n{defuse(text)}\n</{name}-{nonce}>"

