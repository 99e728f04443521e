"""Tokens of TC source.

Identifiers follow the grammar `[_a-zA-Z0-9]*[_a-zA-Z][_a-zA-Z0-9]*`, so they may start with a
digit (the paper's `2LUT`). A run starting with a digit is a number when it is a complete C
literal (`1e5`, `0x1F`, `2.5f`, `7u`) and an identifier otherwise (`1e`, `0x`, `2LUT`); a
number glued to characters that make neither (`1.5x`, `.5f2`) is an error.
"""

from __future__ import annotations

import re

import attrs

from tcstage.errors import Source, Span, TCSyntaxError

# `in` is only a keyword inside where clauses (the paper names a tensor `in`).
KEYWORDS = frozenset({"def", "where"})

# Longest first, so that '+=!' wins over '+=' and '+', and '<=>' over '<='.
PUNCTUATION = (
    "...", "<=>", "+=!", "*=!", "->", "+=", "*=", "==", "!=", "<=", ">=", "&&", "||", "??",
    "(", ")", "{", "}", "[", "]", ",", ".", ":", "?", "!", "<", ">", "=", "+", "-", "*", "/", "%",
)

# C's literal forms. Integer suffixes: u, l, ll in either order and any case (not lL);
# floating suffixes: one f or l. `1f` is accepted as tcstage always has (a float).
_INT_SUFFIX = r"(?:[uU](?:ll|LL|[lL])?|(?:ll|LL|[lL])[uU]?)?"
_NUMBER = re.compile(rf"""
    0[xX][0-9a-fA-F]+{_INT_SUFFIX}
  | (?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFlL]?
  | [0-9]+[eE][+-]?[0-9]+[fFlL]?
  | [0-9]+(?:[fF]|{_INT_SUFFIX})
""", re.VERBOSE)
_IDENT = re.compile(r"[_a-zA-Z0-9]*[_a-zA-Z][_a-zA-Z0-9]*")
_IDENT_CHAR = re.compile(r"[_a-zA-Z0-9]")
_IDENT_CHARS = re.compile(r"[_a-zA-Z0-9]*")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


@attrs.frozen
class Token:
    kind: str  # 'ident', 'number', 'keyword', 'op' or 'eof'
    text: str
    span: Span


def number_value(text: str) -> int | float:
    """The value of a number token: an int for C's integer literals (decimal, octal with a
    leading 0, hex), a float for the others. Suffixes do not change it."""
    lower = text.lower()
    if lower.startswith("0x"):
        return int(lower.rstrip("ul"), 16)
    if "." in lower or "e" in lower or lower.endswith("f"):
        return float(lower.rstrip("fl"))
    digits = lower.rstrip("ul")
    return int(digits, 8 if digits.startswith("0") else 10)


def tokenize(source: Source) -> list[Token]:
    _reject_surrogates(source)
    text, pos, tokens = source.text, 0, []
    while True:
        while pos < len(text):  # whitespace and '#' comments
            if text[pos].isspace():
                pos += 1
            elif text[pos] == "#":
                end = text.find("\n", pos)
                pos = len(text) if end < 0 else end
            else:
                break
        if pos >= len(text):
            tokens.append(Token("eof", "", Span(source, pos, pos)))
            return tokens
        tokens.append(token := _next_token(source, pos))
        pos = token.span.end


def _reject_surrogates(source: Source) -> None:
    """A lone surrogate (from a file decoded with 'surrogateescape', or a bad escape) is not
    text: no encoder writes it, so it would fail wherever the source goes (CUDA comments,
    caches, terminals). Refused here, once, with the error shown on a printable copy."""
    bad = _SURROGATE.search(source.text)
    if bad:
        printable = Source(_SURROGATE.sub("\ufffd", source.text), source.filename)
        raise TCSyntaxError(f"the source holds an unpaired surrogate U+{ord(bad.group()):04X}, "
                            "which is not valid Unicode text",
                            Span(printable, bad.start(), bad.end()),
                            ("decode the file as UTF-8 with errors='strict' or 'replace'",))


def _next_token(source: Source, pos: int) -> Token:
    text = source.text
    if text[pos] == "." and pos > 0 and _IDENT_CHAR.match(text[pos - 1]):
        return Token("op", ".", Span(source, pos, pos + 1))  # 'T.1', not the number '.1'
    number = _NUMBER.match(text, pos)
    glued_end = _IDENT_CHARS.match(text, number.end()).end() if number else pos
    if number and glued_end == number.end():
        span = Span(source, pos, number.end())
        if re.fullmatch(r"0[0-9]*[89][0-9]*[uUlL]*", number.group()):
            raise TCSyntaxError(f"malformed number '{number.group()}': a leading 0 makes an "
                                "octal literal, whose digits are 0 to 7", span)
        return Token("number", number.group(), span)
    ident = _IDENT.match(text, pos)
    if ident:
        word = ident.group()
        # 'min=' and 'max=' are reduction operators, unlike the min(...)/max(...) calls.
        if word in ("min", "max") and text.startswith("=", ident.end()) \
                and not text.startswith("==", ident.end()):
            end = ident.end() + (2 if text.startswith("=!", ident.end()) else 1)
            return Token("op", text[pos:end], Span(source, pos, end))
        return Token("keyword" if word in KEYWORDS else "ident", word, Span(source, pos, ident.end()))
    if number:  # e.g. '1.5x' or '.5f2': a number glued to letters or digits
        raise TCSyntaxError(f"malformed number '{text[pos:glued_end]}'", Span(source, pos, glued_end))
    for punct in PUNCTUATION:
        if text.startswith(punct, pos):
            return Token("op", punct, Span(source, pos, pos + len(punct)))
    raise TCSyntaxError(f"unexpected character {text[pos]!r}", Span(source, pos, pos + 1))
