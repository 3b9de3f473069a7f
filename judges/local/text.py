"""Cheap, deterministic text analysis shared by the local (offline) judges.

Everything here is a pure function over strings. Analyses of texts that recur across events
(retrieved chunks of popular documents, stems of common words) are memoised in bounded caches,
so a stream of events with the same knowledge base stays fast.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Generic, NamedTuple, TypeVar

import snowballstemmer

# Words: letters with inner apostrophes/hyphen-free (hyphenated words are split so "hard-boiled"
# matches "hard boiled"). Numbers: digits with thousands separators or a decimal part.
_TOKEN_RE = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+(?:['’][^\W\d_]+)*")
# A list marker at the start of a line ("1. ", "2) ") is layout, not a claimed number. Matched
# with the newline before it, in the text with a newline put in front: a pattern that starts
# with a fixed character is searched for quickly, where one that starts with ^ is tried at
# every position (3x the time).
_LIST_MARKER_RE = re.compile(r"\n[ \t]*+(?:\d{1,2}[.)]|[-*•])[ \t]+")
# Sentence ends: . ! ? followed by white space and an upper-case letter, digit or quote (the end
# mark captured, to be glued back to its sentence); and every run of white space that holds a
# newline (the text is first cut into lines, which a regex for both took 2.5x as long as).
_SENTENCE_END_RE = re.compile(r"([.!?])\s++(?=[\"“(\[A-Z0-9])")
_LEADING_LIST_MARKER_RE = re.compile(r"[ \t]*(?:\d{1,2}[.)]|[-*•])[ \t]+")
_CAMEL_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
_CLOCK_RE = re.compile(r"\b([01]?\d|2[0-3]):[0-5]?\d\b")
_ORDINAL_SUFFIXES = frozenset({"st", "nd", "rd", "th", "s"})

_NUMBER_WORDS: dict[str, str] = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
    "thirteen": "13", "fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17",
    "eighteen": "18", "nineteen": "19", "twenty": "20", "thirty": "30", "forty": "40",
    "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80", "ninety": "90",
    "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000",
    "first": "1", "second": "2", "third": "3", "fourth": "4", "fifth": "5", "sixth": "6",
    "seventh": "7", "eighth": "8", "ninth": "9", "tenth": "10", "dozen": "12", "half": "0.5",
    "once": "1", "twice": "2", "single": "1", "double": "2", "triple": "3", "pair": "2",
}
# Small numbers are too common as words ("one of", "second half") to count as claims on their
# own, but an answer's "3" is supported by a chunk's "three".
_CLAIM_NUMBER_MIN_WORD = 13

_stemmer = snowballstemmer.stemmer("english")
# Package data (see pyproject: judges/lexicons/*.txt), found next to this module.
_LEXICON_DIR = Path(__file__).resolve().parent.parent / "lexicons"  # judges/lexicons/


def quote(text: str, limit: int = 60) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis, for a rationale."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def load_lexicon(name: str) -> tuple[str, ...]:
    """Lines of `judges/lexicons/<name>.txt`, without blank lines and `#` comments."""
    text = (_LEXICON_DIR / f"{name}.txt").read_text("utf-8")
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return tuple(line for line in lines if line)


STOPWORDS: frozenset[str] = frozenset(load_lexicon("stopwords"))


# No word of a natural language is longer; a longer "word" (a hash, a run of one letter) is
# kept as it is, since the pure-Python stemmer takes about a second per megabyte of it.
_MAX_STEMMED_LENGTH = 64


@functools.lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    """Snowball (Porter 2) stem of a lower-case word; "studies" and "study" share one."""
    if len(word) > _MAX_STEMMED_LENGTH:
        return word
    return str(_stemmer.stemWord(word))


def normalise_number(token: str) -> str:
    """Canonical form of a numeric token: "1,000" and "1000.0" both become "1000"."""
    if "," in token and re.fullmatch(r"\d{1,3}(?:,\d{3})+", token):
        token = token.replace(",", "")
    elif "," in token:
        token = token.replace(",", ".")
    if "." in token:
        whole, _, frac = token.partition(".")
        frac = frac.rstrip("0")
        token = f"{whole}.{frac}" if frac else whole
    return token.lstrip("0") or "0"


@dataclasses.dataclass(frozen=True, slots=True)
class Bag:
    """The comparable content of a text: stems of its content words and its numbers."""

    stems: frozenset[str]
    numbers: frozenset[str]


class Claim(NamedTuple):
    """One sentence of an answer with its content words (ordered, for naming them).

    A named tuple rather than a frozen dataclass: one is made per sentence judged, and a
    tuple is built in C (the frozen dataclass's `__init__` sets each field through
    `object.__setattr__`, 0.69 against 0.30 µs)."""

    text: str
    words: tuple[tuple[str, str], ...]  # (surface form, stem)
    numbers: tuple[tuple[str, str], ...]  # (surface form, normalised)
    names: tuple[tuple[str, str], ...]  # (surface, stem) of capitalised non-initial words


# Tokens never contain whitespace, so a text's tokens are those of its whitespace-separated
# pieces in order. Pieces ("days.", "The", "30") recur far more than whole texts do, so the
# analyses below are memoised per piece: a chunk never seen before still costs one `str.split`
# and a cache hit per piece instead of a regex pass and a stem look-up per token.
_PIECE_CACHE = 200_000

_Analysis = TypeVar("_Analysis")


class PieceMemo(dict[str, _Analysis], Generic[_Analysis]):
    """A bounded memo of one analysis of pieces, for the analyses looked up once per piece of
    every text (each event's answer, each new chunk): `memo[piece]`, the analysis computed on
    a miss (`__missing__`).

    A hit is one dict look-up in C, where functools.lru_cache also relinks its recency list
    (in this judge's profile, on a busy machine, its look-ups took half again as long). For the
    bound: when full, the memo starts afresh and keeps the full generation to consult on a miss,
    so a piece still in use costs one miss, not a new analysis.
    """

    __slots__ = ("_analyse", "_generation_size", "_previous")

    def __init__(self, analyse: Callable[[str], _Analysis], size: int) -> None:
        super().__init__()
        self._analyse = analyse
        self._generation_size = size // 2  # two generations at most
        self._previous: dict[str, _Analysis] = {}

    def __missing__(self, piece: str) -> _Analysis:
        previous = self._previous
        analysis = previous[piece] if piece in previous else self._analyse(piece)
        if len(self) >= self._generation_size:
            self._previous = dict(self)
            self.clear()
        self[piece] = analysis
        return analysis


@functools.lru_cache(maxsize=_PIECE_CACHE)
def piece_tokens(piece: str) -> tuple[str, ...]:
    """Word and number tokens of one whitespace-free piece of text (memoised)."""
    return tuple(_TOKEN_RE.findall(piece))


def _tokens_of(text: str) -> itertools.chain[str]:
    return itertools.chain.from_iterable(map(piece_tokens, text.split()))


def tokens(text: str) -> list[str]:
    """Word and number tokens of `text`, in order."""
    return list(_tokens_of(text))


def _analyse_piece_bag(piece: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What one piece adds to a `Bag`: (stems, numbers), each in order of first appearance
    (a summary's rationale names stems in this order, so it must not depend on set order, which
    changes from one process to the next with string hashing); see `bag_of`."""
    # dicts as ordered sets
    stems: dict[str, None] = {}
    numbers: dict[str, None] = {}
    # a piece without spaces can repeat a token a lot: each distinct one once
    for tok in dict.fromkeys(piece_tokens(piece)):
        if tok[0].isdigit():
            numbers[normalise_number(tok)] = None
            continue
        low = tok.lower()
        num = _NUMBER_WORDS.get(low)
        if num is not None:
            numbers[num] = None
        if low not in STOPWORDS:
            stems[stem(low)] = None
        if not tok.islower() and not tok.isupper():
            # Structured sources name fields in camelCase ("OutdoorSeating", "WiFi"): the
            # answer says "outdoor seating" / "Wi-Fi", so the parts count as content too.
            # (This also runs for "The": once per distinct piece, so not worth a pre-check
            # that would have to mind non-ASCII words like "Éclair", which yield "clair".)
            for part in _CAMEL_RE.findall(tok):
                part_low = part.lower()
                if part_low not in STOPWORDS:
                    stems[stem(part_low)] = None
    # A clock time never spans whitespace and \b sees whitespace like a text's edge, so the
    # piece's matches are the text's. "20:00" supports "8 pm": add the 12-hour reading.
    for hour in _CLOCK_RE.findall(piece):
        h = int(hour)
        if 12 < h < 24:
            numbers[str(h - 12)] = None
    return tuple(stems), tuple(numbers)


_piece_bag = PieceMemo(_analyse_piece_bag, _PIECE_CACHE).__getitem__


_STEMS_PART = operator.itemgetter(0)


def content_stems(text: str) -> list[str]:
    """The content-word stems of `text`, piece by piece (each piece's once), from the
    memoised piece analyses: a few µs for a sentence."""
    return list(itertools.chain.from_iterable(map(_STEMS_PART, map(_piece_bag, text.split()))))
_NUMBERS_PART = operator.itemgetter(1)


@functools.lru_cache(maxsize=4096)
def bag_of(text: str) -> Bag:
    """Stems and numbers of a (context) text; memoised because chunks recur."""
    return bag_of_texts((text,))


def bag_of_texts(texts: Iterable[str], more_stems: Iterable[str] = ()) -> Bag:
    """The union of the bags of `texts`, from their distinct pieces at once, with `more_stems`
    (not memoised: for the chunks of one event, whose union is memoised by its caller)."""
    pieces: set[str] = set()
    for text in texts:
        pieces.update(text.split())
    parts = list(map(_piece_bag, pieces))
    stems = itertools.chain.from_iterable(map(_STEMS_PART, parts))
    return Bag(
        frozenset(itertools.chain(more_stems, stems)),
        frozenset(itertools.chain.from_iterable(map(_NUMBERS_PART, parts))),
    )


# The judges of one event each split its answer (groundedness into claims, relevance for a
# refusal): the last few splits are kept, so that they split it once.
@functools.lru_cache(maxsize=16)
def split_sentences(text: str) -> tuple[str, ...]:
    """Sentences and list items of `text`, list markers removed, empty pieces dropped."""
    return _split(text, 0)


def first_sentences(text: str, count: int) -> tuple[str, ...]:
    """`split_sentences(text)[:count]`, splitting only as far as the `count`-th sentence (for
    a check that reads a text's first few sentences only: relevance's refusal check)."""
    return _split(text, count)[:count]


def _split(text: str, count: int) -> tuple[str, ...]:
    # The sentences of `text`, or with `count` > 0 at least its first `count` (or all, when
    # fewer): lines and sentences are split in order, so the first ones do not depend on what
    # follows them. Only the last piece of a line can be empty or white space (every other one
    # ends with its end mark): that one is dropped.
    if "\n" not in text:
        # One line (most answers): only a marker at the very start can exist.
        marker = _LEADING_LIST_MARKER_RE.match(text)
        return tuple(_line_sentences(text[marker.end() :] if marker is not None else text, count))
    lines = _LIST_MARKER_RE.sub("\n", "\n" + text)[1:].split("\n")
    last = len(lines) - 1
    pieces: list[str] = []
    for i, line in enumerate(lines):
        # The white space around a newline goes with it; that at the text's ends stays.
        line = line.lstrip() if i else line
        line = line.rstrip() if i < last else line
        if line:
            pieces += _line_sentences(line, count and count - len(pieces))
            if count and len(pieces) >= count:
                break
    return tuple(pieces)


def _line_sentences(line: str, count: int) -> list[str]:
    """The sentences of one line, or at least the first `count` when it is > 0 (a regex split
    stops after `count` end marks, the rest of the line as one piece)."""
    parts = _SENTENCE_END_RE.split(line, count)
    pieces = list(map(operator.add, parts[:-1:2], parts[1::2]))  # each with its end mark
    rest = parts[-1]
    if rest and not rest.isspace():
        pieces.append(rest)
    return pieces


# How a token of an answer counts, with what `claim_of` asks of it: (token, kind, (token,
# value), starts with a digit, starts upper-case, is an ordinal suffix); kind is "num" (value
# normalised), "word" (value = stem) or "skip".
_ClaimToken = tuple[str, str, tuple[str, str], bool, bool, bool]


@functools.lru_cache(maxsize=_PIECE_CACHE)
def _claim_token(tok: str) -> _ClaimToken:
    kind, value = _token_info(tok)
    return (
        tok, kind, (tok, value), tok[0].isdigit(), tok[0].isupper(), tok in _ORDINAL_SUFFIXES
    )


def _token_info(tok: str) -> tuple[str, str]:
    if tok[0].isdigit():
        return "num", normalise_number(tok)
    low = tok.lower()
    num = _NUMBER_WORDS.get(low)
    if num is not None:
        # Small number words are too common ("one of", "second half") to be claims of their own.
        return ("num", num) if float(num) >= _CLAIM_NUMBER_MIN_WORD else ("skip", "")
    if low in STOPWORDS:
        return "skip", ""
    return "word", stem(low)


@dataclasses.dataclass(frozen=True, slots=True)
class _PieceClaim:
    """What one whitespace-separated piece adds to a `Claim`, worked out once per distinct
    piece: a sentence's claim is then the concatenation of its pieces' (the profile of the
    three default judges showed `claim_of` token by token as the largest single cost)."""

    words: tuple[tuple[str, str], ...]
    numbers: tuple[tuple[str, str], ...]
    names: tuple[tuple[str, str], ...]  # including the piece's first token when it is one
    empty: bool  # no token at all
    first_is_name: bool  # names[0] is the piece's first token
    leads_with_suffix_word: bool  # the first token is an ordinal suffix kept as words[0]
    ends_with_number: bool  # the last token starts with a digit


def _analyse_piece_claim(piece: str) -> _PieceClaim:
    infos = tuple(map(_claim_token, piece_tokens(piece)))
    if not infos:
        return _PieceClaim((), (), (), True, False, False, False)
    # "2nd", "1990s": a suffix right after a number is part of it.
    kept = (infos[0], *(t for prev, t in itertools.pairwise(infos) if not (t[5] and prev[3])))
    first = kept[0]
    return _PieceClaim(
        tuple(t[2] for t in kept if t[1] == "word"),
        tuple(t[2] for t in kept if t[1] == "num"),
        tuple(t[2] for t in kept if t[4] and t[1] == "word"),
        False,
        first[4] and first[1] == "word",
        first[5] and first[1] == "word",
        infos[-1][3],
    )


_piece_claim = PieceMemo(_analyse_piece_claim, _PIECE_CACHE).__getitem__


def claim_of(sentence: str) -> Claim:
    """Content words, numbers and names claimed by one answer sentence."""
    words: list[tuple[str, str]] = []
    numbers: list[tuple[str, str]] = []
    names: list[tuple[str, str]] = []
    first = True
    after_number = False
    for part in map(_piece_claim, sentence.split()):
        if part.empty:
            continue
        # A suffix piece after a number piece ("5 th") belongs to the number, as in a piece.
        words += part.words[1:] if part.leads_with_suffix_word and after_number else part.words
        numbers += part.numbers
        # Capitalised words other than the sentence's first token are names.
        names += part.names[1:] if first and part.first_is_name else part.names
        first = False
        after_number = part.ends_with_number
    return Claim(sentence, tuple(words), tuple(numbers), tuple(names))


@dataclasses.dataclass(frozen=True, slots=True)
class Coverage:
    """How much of a target text (an expected answer, a fact, a question) another text holds:
    the target's distinct content words and numbers, and those the other text lacks."""

    words: int
    numbers: int
    missing_words: tuple[str, ...]  # surface forms, in the target's order
    missing_numbers: tuple[str, ...]

    @property
    def share(self) -> float:
        """The share of the target's content words found (1.0 for a target without any)."""
        return (self.words - len(self.missing_words)) / self.words if self.words else 1.0


def coverage(target: str, evidence: Bag) -> Coverage:
    """Which content words (by stem) and numbers of `target` the `evidence` bag lacks (pure)."""
    claim = claim_of(target)
    words: dict[str, str] = {}  # stem -> its first surface form
    for surface, s in claim.words:
        words.setdefault(s, surface)
    numbers: dict[str, str] = {}
    for surface, n in claim.numbers:
        numbers.setdefault(n, surface)
    return Coverage(
        len(words),
        len(numbers),
        tuple(w for s, w in words.items() if s not in evidence.stems),
        tuple(raw for n, raw in numbers.items() if n not in evidence.numbers),
    )
