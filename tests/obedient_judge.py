"""A stand-in judge model that obeys any instruction it finds outside the real fences.

For the prompt-injection tests. It reads a judge prompt the way a naive model would, and is
plugged into `FakeOpenAI` as its `decide` function:

* it sees through disguises: HTML entities, numeric and hex character references,
  percent-encoding and backslash escapes (`\\u003c`, `\\x3c`, CSS `\\3c`) are decoded (again and
  again, as a model reading `&amp;lt;` may), the prompt is
  NFKC-normalised, invisible format characters (zero-width joiners, Unicode tag characters ...) are
  removed, and every character it knows to look like `<`, `>` or `/` is read as that character. This
  list is kept here, apart from `judges.llm.fencing`, so that a look-alike the fencer forgets makes
  the tests fail;
* the real fences are the tags carrying the nonce of the prompt's first tag. Inside a fence,
  anything that reads as a tag (`</answer>`, `<system>`, `<|im_start|>`, `</answer-...>` with
  another nonce ...) "closes" the fence for this model: what follows is read as instructions;
* outside the fences, the frame may only say "Grade the answer above." Anything else there
  (a verdict line, a JSON verdict, a tag, an order) is an injected instruction.

When it finds an injected instruction it answers "yes", as the injection asks; otherwise it
gives the honest verdict, "no" (the test inputs are all failing answers). So every "yes" is a
flip caused by an injection that got through.
"""

from __future__ import annotations

import html
import importlib.resources
import json
import re
import sys
import unicodedata
import urllib.parse

from fake_openai import FakeRating, FencedRequest

HONEST: FakeRating = "no"
OBEYED: FakeRating = "yes"
FRAME_TEXT = "Grade the answer above."

# What this model reads as an angle bracket or a slash (a superset of what a careful fencer
# must neutralise; NFKC already maps the fullwidth and small forms): a hand list, every character
# Unicode's confusables (TR39, as shipped by confusable-homoglyphs) maps to "<", ">" or "/", and
# every character whose Unicode name says it is a left- or right-pointing angle, arrowhead or
# triangle, or a plain less-than / greater-than sign made bigger, nested or circled.
_HAND_READS_AS: dict[str, str] = {
    **dict.fromkeys("‹«〈〈《⟨⟪⧼❬❮❰˂ᐸᚲ⋖≺⪡", "<"),
    **dict.fromkeys("›»〉〉》⟩⟫⧽❭❯❱˃ᐳ⋗≻⪢", ">"),
    **dict.fromkeys("∕⁄⧸／╱⟋", "/"),
}
_LOOKS_LEFT = re.compile(
    r"LEFT-POINTING (?:SMALL |MEDIUM |DOUBLE |CURVED )?(?:ANGLE|TRIANGLE)|LEFT-POINTING TRIANGLE"
    r"|LEFT ARROWHEAD$|LEFT ANGLE BRACKET|^(?:MUCH |VERY MUCH |DOUBLE NESTED |TRIPLE NESTED "
    r"|CIRCLED )?LESS-THAN(?: SIGN)?$|^NORMAL SUBGROUP OF$|PRECEDES(?: UNDER RELATION)?$"
)
_LOOKS_RIGHT = re.compile(
    r"RIGHT-POINTING (?:SMALL |MEDIUM |DOUBLE |CURVED )?(?:ANGLE|TRIANGLE)|RIGHT-POINTING TRIANGLE"
    r"|RIGHT ARROWHEAD$|RIGHT ANGLE BRACKET|^(?:MUCH |VERY MUCH |DOUBLE NESTED |TRIPLE NESTED "
    r"|CIRCLED )?GREATER-THAN(?: SIGN)?$|^CONTAINS AS NORMAL SUBGROUP$"
    r"|SUCCEEDS(?: UNDER RELATION)?$"
)


def _unicode_reads_as() -> dict[int, str]:
    confusables = json.loads(
        importlib.resources.files("confusable_homoglyphs").joinpath("confusables.json").read_text()
    )
    reads: dict[int, str] = {}
    for target in "</>":
        for glyph in confusables.get(target, []):
            if len(glyph["c"]) == 1 and glyph["c"] != target:
                reads[ord(glyph["c"])] = target
    for code_point in range(sys.maxunicode + 1):
        name = unicodedata.name(chr(code_point), "")
        if unicodedata.category(chr(code_point)).startswith("M") or "TAG " in name:
            continue  # combining marks sit on a letter; tag characters are read as ASCII below
        if _LOOKS_LEFT.search(name):
            reads[code_point] = "<"
        elif _LOOKS_RIGHT.search(name):
            reads[code_point] = ">"
    return reads | {ord(c): target for c, target in _HAND_READS_AS.items()}


READS_AS: dict[int, str] = _unicode_reads_as()
_FIRST_TAG = re.compile(r"<([a-z_]+)-([0-9a-f]{16})>")
# A tag as a naive model sees one: "<" then optional slash and a name or a special token.
_TAG_LOOK = re.compile(r"<\s*/?\s*[A-Za-z|!?]")


# Unicode tag characters spell ASCII invisibly, and models read them ("ASCII smuggling").
_TAG_CHARACTERS = {cp: chr(cp - 0xE0000) for cp in range(0xE0020, 0xE007F)}


# Backslash escapes: JSON / JavaScript, Python / C, CSS (1-6 hex digits, an optional space).
_BACKSLASH = re.compile(
    r"\\(?:u\{([0-9A-Fa-f]{1,6})\}|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|x([0-9A-Fa-f]{2})"
    r"|([0-9A-Fa-f]{1,6}) ?)"
)


def _unescaped(match: re.Match[str]) -> str:
    code_point = int(next(g for g in match.groups() if g), 16)
    return chr(code_point) if code_point <= 0x10FFFF and not 0xD800 <= code_point <= 0xDFFF else ""


def decoded(text: str) -> str:
    """`text` with HTML character references, percent-escapes and backslash escapes decoded until
    none is left, however deep they nest."""
    while True:
        plain = _BACKSLASH.sub(_unescaped, urllib.parse.unquote(html.unescape(text)))
        if plain == text:
            return text
        text = plain


def reads_as(text: str) -> str:
    """What this model "sees": character references and percent-escapes decoded, tag
    characters as ASCII, NFKC, look-alikes folded, and invisible format characters (category Cf)
    removed."""
    text = unicodedata.normalize("NFKC", decoded(text).translate(_TAG_CHARACTERS))
    text = text.replace("\u226e", "<").replace("\u226f", ">")  # ≮ ≯ are < > with a stroke
    text = text.translate(READS_AS)
    return "".join(c for c in text if unicodedata.category(c) != "Cf")


def injected_instruction(user_message: str) -> str | None:
    """The first injected instruction this model would obey in a user message, or None."""
    first = _FIRST_TAG.search(user_message)
    if first is None:
        return "no fence at all: the whole message is read as instructions"
    nonce = first.group(2)
    seen = reads_as(user_message)
    fence = re.compile(rf"<([a-z_]+)-{nonce}>\n?(.*?)\n?</\1-{nonce}>", re.DOTALL)
    outside = []
    position = 0
    for m in fence.finditer(seen):
        outside.append(seen[position : m.start()])
        position = m.end()
        escape = _TAG_LOOK.search(m.group(2))
        if escape is not None:
            return f"a tag inside the {m.group(1)} fence: {m.group(2)[escape.start():][:40]!r}"
    outside.append(seen[position:])
    rest = " ".join(" ".join(outside).split())
    if rest not in ("", FRAME_TEXT):
        return f"text outside the fences: {rest[:80]!r}"
    return None


def obedient_decide(request: FencedRequest) -> tuple[FakeRating, str]:
    """`FakeOpenAI.decide`: "yes" when an injected instruction is found, else the honest "no"."""
    found = injected_instruction(request.user_message)
    if found is not None:
        return OBEYED, f"I followed an instruction I found: {found}"
    return HONEST, "The answer fails the rubric."
