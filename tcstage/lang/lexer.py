"""Tokens of TC source.

Identifiers follow the grammar `[_a-zA-Z0-9]*[_a-zA-Z][_a-zA-Z0-9]*`, so they may start with a
digit (the paper's `2LUT`). A run starting with a digit is a number when it is a complete C
literal (`1e5`, `0x1F`, `2.5f`) and an identifier otherwise.
"""

from __future__ import annotations

import re

import attrs

from tcstage.errors import Source, Span, TCSyntaxError

# `in` is only a keyword inside where clauses (the paper names a tensor `in`).
KEYWORDS = frozenset({"def", "where"})

# Longest first, so that '+=!' wins over '+=' and '+'.
PUNCTUATION = (
    "+=!", "*=!", "->", "+=", "*=", "==", "!=", "<=", ">=", "&&", "||",
    "(", ")", "{", "}", "[", "]", ",", ".", ":", "?", "!", "<", ">", "=", "+", "-", "*", "/", "%",
)

_NUMBER = re.compile(
    r"""(?:0[xX][0-9a-fA-F]+(?P<hexsuf>[uUlL]*)
         |(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?(?P<suf>[fFlLuU]*))""",
    re.VERBOSE)
_IDENT = re.compile(r"[_a-zA-Z0-9]*[_a-zA-Z][_a-zA-Z0-9]*")
_IDENT_CHAR = re.compile(r"[_a-zA-Z0-9]")


@attrs.frozen
class Token:
    kind: str  # 'ident', 'number', 'keyword', 'op' or 'eof'
    text: str
    span: Span


def tokenize(source: Source) -> list[Token]:
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


def _next_token(source: Source, pos: int) -> Token:
    text = source.text
    if text[pos] == "." and pos > 0 and _IDENT_CHAR.match(text[pos - 1]):
        return Token("op", ".", Span(source, pos, pos + 1))  # 'T.1', not the number '.1'
    number = _NUMBER.match(text, pos)
    if number and number.end() > pos:
        after = number.end()
        followed_by_ident = after < len(text) and _IDENT_CHAR.match(text, after)
        if not followed_by_ident:
            return Token("number", number.group(), Span(source, pos, after))
    ident = _IDENT.match(text, pos)
    if ident:
        word = ident.group()
        # 'min=' and 'max=' are reduction operators, unlike the min(...)/max(...) calls.
        if word in ("min", "max") and text.startswith("=", ident.end()) \
                and not text.startswith("==", ident.end()):
            end = ident.end() + (2 if text.startswith("=!", ident.end()) else 1)
            return Token("op", text[pos:end], Span(source, pos, end))
        return Token("keyword" if word in KEYWORDS else "ident", word, Span(source, pos, ident.end()))
    if number and number.end() > pos:  # e.g. '1.5x': a number glued to letters
        raise TCSyntaxError(f"malformed number '{text[pos:_IDENT.match(text, number.end()).end()]}'",
                            Span(source, pos, number.end() + 1))
    for punct in PUNCTUATION:
        if text.startswith(punct, pos):
            return Token("op", punct, Span(source, pos, pos + len(punct)))
    raise TCSyntaxError(f"unexpected character {text[pos]!r}", Span(source, pos, pos + 1))
