"""Inputs for the front-end property: `tc.define(text)` succeeds or raises `TCError`, quickly.

Four sources, each a function of a `random.Random` (so hypothesis can drive it through
`st.randoms()` and the campaign through seeds):

- `random_text`: arbitrary characters and decoded bytes (surrogates, NULs, controls);
- `token_soup`: the shape of a TC function with random tokens of TC's vocabulary in its slots,
  including literals at the edges of their types and deep nesting;
- `grammar_tc`: syntactically valid TC with random semantics (unknown names, wrong ranks,
  reductions without operators, odd types, where clauses on anything);
- `mutant`: an example (examples/*.tc) or a generated well-formed program with tokens deleted,
  duplicated, swapped, renamed or replaced, and numbers changed.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"

KEYWORDS = ("def", "where", "in")
TYPES = ("float", "double", "half", "int", "int8", "int16", "int32", "int64", "uint8", "uint32",
         "uint64", "byte", "bool", "float16", "float32", "float64", "complex", "void")
PUNCT = ("+=!", "*=!", "min=!", "max=!", "+=", "*=", "min=", "max=", "->", "==", "!=", "<=",
         ">=", "&&", "||", "(", ")", "{", "}", "[", "]", ",", ".", ":", "?", "!", "<", ">", "=",
         "+", "-", "*", "/", "%", "<=>", ";", "#", "@", "$", "\\", "`", "'", '"')
NAMES = ("A", "B", "C", "O", "T", "N", "M", "K", "i", "j", "k", "l", "in", "out", "f", "g",
         "exp", "expf", "max", "min", "fmax", "abs", "sigmoid", "tanh", "int", "float", "main",
         "class", "if", "NULL", "NAN", "INFINITY", "threadIdx", "__syncthreads", "printf",
         "T_0", "_", "__", "2LUT", "x1", "A_in", "O_0", "S0", "self", "None", "é", "λ")
NUMBERS = ("0", "1", "2", "3", "10", "0.5", ".5", "5.", "1e5", "1e-5", "2.5f", "1.f", "0x1F",
           "017", "08", "1u", "1ul", "1L", "0xffffffffffffffff", "4294967297", "2147483647",
           "2147483648", "-2147483648", "9223372036854775808", "1e400", "1e-400", ".5f2",
           "0x", "1e", "1.5x", "00", "0.0", "3.4028235e38", "nan", "inf")


def _pick(rng: random.Random, pool):
    return pool[rng.randrange(len(pool))]


def random_token(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.3:
        return _pick(rng, NAMES)
    if r < 0.5:
        return _pick(rng, PUNCT)
    if r < 0.7:
        return _pick(rng, NUMBERS)
    if r < 0.8:
        return _pick(rng, KEYWORDS + TYPES)
    if r < 0.9:
        return "".join(rng.choice("abcXYZ_019") for _ in range(rng.randint(1, 6)))
    return chr(rng.choice((0, 7, 9, 10, 13, 0x85, 0xa0, 0x2028, 0xfeff, 0xd800, 0xdfff,
                           rng.randrange(0x20, 0x3000))))


# -- 1. random text ------------------------------------------------------------------------------

def random_text(rng: random.Random) -> str:
    n = rng.choice((0, 1, 2, 5, 20, 100, 400))
    r = rng.random()
    if r < 0.3:
        return bytes(rng.randrange(256) for _ in range(n)).decode(
            rng.choice(("latin-1", "utf-8")), errors=rng.choice(("replace", "surrogateescape")))
    if r < 0.6:
        return "".join(chr(rng.randrange(0x20, 0x7f)) for _ in range(n))
    if r < 0.8:
        alphabet = "def(){}[]<>=+-*/%!?:,.#\n \tAij0123456789fxe_"
        return "".join(rng.choice(alphabet) for _ in range(n))
    return "".join(chr(rng.randrange(0, 0x11000)) for _ in range(n))


# -- 2. token soup in TC's shape -------------------------------------------------------------

def _deep(rng: random.Random) -> str:
    """Nesting a recursive-descent parser must survive (or refuse with a TCError)."""
    depth = rng.choice((50, 200, 1000, 3000))
    kind = rng.randrange(5)
    if kind == 0:
        return "-" * depth + "A(i)"
    if kind == 1:
        return "(" * depth + "A(i)" + ")" * depth
    if kind == 2:
        return "A(" * depth + "i" + ")" * depth
    if kind == 3:
        return " + ".join(["A(i)"] * depth)
    return "!" * depth + "A(i)"


def _soup(rng: random.Random, n: int) -> str:
    return " ".join(random_token(rng) for _ in range(n))


def token_soup(rng: random.Random) -> str:
    slot = lambda default: default if rng.random() < 0.7 else _soup(rng, rng.randint(0, 4))  # noqa: E731
    params = slot("float(N, M) A, float(M) B")
    outs = slot("O")
    body = []
    for _ in range(rng.randint(0, 3)):
        lhs = slot("O(i)")
        op = slot(rng.choice(("=", "+=!", "max=", "*=!")))
        rhs = _deep(rng) if rng.random() < 0.08 else slot("A(i, j) * B(j)")
        where = slot("where j in 0:M") if rng.random() < 0.3 else ""
        body.append(f"  {lhs} {op} {rhs} {where}")
    text = f"{slot('def')} {slot('f')}({params}) -> ({outs}) {slot('{')}\n" + "\n".join(body) + \
        f"\n{slot('}')}"
    if rng.random() < 0.2:
        text += f"\n# {_soup(rng, 3)}"
    if rng.random() < 0.1:
        text = text + "\n" + text  # two functions, maybe of the same name
    return text


# -- 3. syntactically valid TC with random meaning -----------------------------------------------

def _expr(rng: random.Random, names: list[str], depth: int) -> str:
    r = rng.random()
    if depth <= 0 or r < 0.3:
        choice = rng.random()
        if choice < 0.45:
            return _pick(rng, names)
        if choice < 0.75:
            return _pick(rng, NUMBERS[:20])
        return f"{_pick(rng, names)}.{rng.randint(0, 3)}"
    if r < 0.5:
        args = ", ".join(_expr(rng, names, depth - 1) for _ in range(rng.randint(0, 4)))
        return f"{_pick(rng, names)}({args})"
    if r < 0.75:
        op = _pick(rng, ("+", "-", "*", "/", "%", "<", "<=", "==", "!=", "&&", "||", ">", ">="))
        return f"{_expr(rng, names, depth - 1)} {op} {_expr(rng, names, depth - 1)}"
    if r < 0.85:
        return f"{rng.choice('-!+')}{_expr(rng, names, depth - 1)}"
    if r < 0.93:
        return f"({_expr(rng, names, depth - 1)})"
    return (f"{_expr(rng, names, depth - 1)} ? {_expr(rng, names, depth - 1)} : "
            f"{_expr(rng, names, depth - 1)}")


def grammar_tc(rng: random.Random) -> str:
    """Mostly plausible names and shapes (so checks past the first run), random expressions."""
    odd = lambda: rng.random() < 0.08  # noqa: E731 - now and then, break a rule
    sizes = rng.sample(("N", "M", "K", "P", "1", "3"), rng.randint(1, 4))
    inputs = []
    for name in rng.sample(("A", "B", "C", "I", "s", "W"), rng.randint(0, 4)):
        dims = [rng.choice(sizes) for _ in range(rng.choice((0, 1, 1, 2, 2, 3)))]
        t = _pick(rng, TYPES) if odd() else rng.choice(("float", "float", "int", "double"))
        inputs.append(f"{t}({', '.join(dims)}) {name}" if dims else f"{t} {name}")
    outputs = rng.sample(("O", "P", "A", "N") if odd() else ("O", "P", "Q"), rng.randint(1, 2))
    tensors = [p.split()[-1] for p in inputs]
    names = tensors + outputs + ["T"] + [s for s in sizes if not s.isdigit()]
    statements = []
    for _ in range(rng.randint(1, 4)):
        tensor = rng.choice(outputs + ["T"] + (["A", "exp"] if odd() else []))
        idx = rng.sample(("i", "j", "k", "l") + (("N", "A") if odd() else ()), rng.randint(0, 3))
        lhs = f"{tensor}({', '.join(idx)})" if not odd() else tensor
        op = rng.choice(("=", "+=", "+=!", "*=", "*=!", "min=", "min=!", "max=", "max=!"))
        local = names + idx + ["i", "j", "k", "l", "exp", "max", "fmaxf", "sigmoid"]
        rhs = _deep(rng) if rng.random() < 0.04 else _expr(rng, local, rng.randint(0, 4))
        text = f"{lhs} {op} {rhs}"
        if rng.random() < 0.35:
            wheres = []
            for _ in range(rng.randint(1, 2)):
                v = rng.choice(idx + ["k", "l"] + (["N", "z"] if odd() else []))
                lo, hi = _expr(rng, local, 1), _expr(rng, local, 1)
                wheres.append(rng.choice((f"{v} in {lo}:{hi}", f"{v} = [{lo}, {hi}[",
                                          f"{v} = [{lo}, {hi}]")))
            text += " where " + ", ".join(wheres)
        if rng.random() < 0.02:
            text += " <=> matmul(A(i, k), B(k, j))"
        statements.append("  " + text)
    name = rng.choice(("main", "int", "2LUT", "if", "printf")) if odd() else "f"
    arrow = f"-> ({', '.join(outputs)})" if not odd() else f"-> {outputs[0]}"
    return f"def {name}({', '.join(inputs)}) {arrow} {{\n" + "\n".join(statements) + "\n}\n"


# -- 4. mutations of real programs ------------------------------------------------------------

_TOKEN = re.compile(r"\s+|#[^\n]*|[A-Za-z_0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?[fFuUlL]*"
                    r"|\+=!|\*=!|->|[+*]=|==|!=|<=|>=|&&|\|\||.", re.S)


def example_sources() -> list[str]:
    texts = []
    for path in sorted(EXAMPLES_DIR.glob("*.tc")):
        text = path.read_text()
        texts.append(text)
        # each function alone too
        texts += ["def " + part for part in text.split("\ndef ")[1:]]
    return texts


def mutate(rng: random.Random, text: str) -> str:
    tokens = _TOKEN.findall(text)
    words = [k for k, t in enumerate(tokens) if not t.isspace()]
    for _ in range(rng.choice((1, 1, 2, 3))):
        if not words:
            break
        k = rng.choice(words)
        r = rng.random()
        if r < 0.2:
            tokens[k] = ""
        elif r < 0.3:
            tokens[k] = tokens[k] + " " + tokens[k]
        elif r < 0.45:
            j = rng.choice(words)
            tokens[k], tokens[j] = tokens[j], tokens[k]
        elif r < 0.6 and tokens[k][:1].isdigit():
            tokens[k] = _pick(rng, NUMBERS)
        elif r < 0.75 and re.fullmatch(r"[A-Za-z_]\w*", tokens[k]):
            old, new = tokens[k], _pick(rng, NAMES)
            if rng.random() < 0.5:
                tokens = [new if t == old else t for t in tokens]
            else:
                tokens[k] = new
        elif r < 0.9:
            tokens[k] = random_token(rng)
        else:
            tokens.insert(k, random_token(rng) + " ")
            words = [j for j, t in enumerate(tokens) if not t.isspace()]
    return "".join(tokens)


_CORPUS: list[str] = []


def mutant(rng: random.Random) -> str:
    if not _CORPUS:
        _CORPUS.extend(example_sources())
    if rng.random() < 0.4:
        from .programs import case  # generated well-formed programs as seeds
        base = case(rng.randrange(10 ** 6)).source
    else:
        base = rng.choice(_CORPUS)
    return mutate(rng, base)


GENERATORS = {"text": random_text, "soup": token_soup, "grammar": grammar_tc, "mutant": mutant}


def input_for(kind: str, seed: int) -> str:
    """The deterministic input number `seed` of generator `kind`."""
    return GENERATORS[kind](random.Random(f"{kind}/{seed}"))
