"""A gradient oracle for `tcstage.grad.backward`: random well-formed TC functions (programs.py),
retyped to float64, differentiated, and checked against central differences.

For each case: the forward runs on the CPU (unscheduled, for fast compiles); `backward` generates
the backward TC, which is defined and run; then for every floating-point input x and a random
direction v, <d_x, v> must equal <d_out, f(x + eps v) - f(x - eps v)> / (2 eps), the loss being
<d_out, f(x)> over every output (d_out random, zero where the reference says no statement writes).

The generator's values are multiples of 1/4, where max/min/fabs/comparisons tie on purpose; the
oracle moves every floating-point input value by a small random amount so that ties are rare, and
still judges each input's point smooth only where the central differences at eps and eps/10
agree (a kink or a jump within eps of the point makes them disagree): otherwise that input is
skipped and counted.

Outcomes (`Outcome.kind`):
- 'ok': every checked input matched (some may have been skipped as non-smooth);
- 'refused': `backward` raised a documented TCError (`reason` tallies its message's shape);
- 'invalid': the generated backward function is not a valid TC (a bug);
- 'crash': an exception other than TCError anywhere in generating or running it (a bug);
- 'backward-error': a TCError defining or running the backward TC (a bug);
- 'mismatch': an input's gradient disagrees with the central differences (a bug);
- 'missing': a floating-point input without a gradient whose central difference is not 0 (a bug);
- 'keep-error', 'keep-mismatch': the keeping pair (`tcstage.grad.keeping`, what tcstage.torch
  runs where autograd records a call) failed, or its forward's outputs or its backward's
  gradients differ from the plain forward's and backward's (bugs);
- 'forward': the float64 forward itself failed or gave non-finite values (not the gradient's
  fault; counted apart).
"""

from __future__ import annotations

import re
import traceback
import warnings

import attrs
import numpy as np

import tcstage as tc
from tcstage.grad import backward
from tcstage.grad.keeping import keeping
from tcstage.lang.retype import retype_source
from tcstage.lang.types import FLOAT64

from . import nodes as N
from .programs import CORE_FEATURES, Case

#: The generator's features for gradients: in/out outputs are always refused (documented), so
#: programs with them would only dilute a campaign.
FEATURES = CORE_FEATURES - {"inout"}

BUG_KINDS = ("invalid", "crash", "backward-error", "mismatch", "missing", "keep-error",
             "keep-mismatch")
EPS = 1e-4  # the larger step; the smaller is EPS / 10
EPS32 = 1e-2  # the same where a float32 tensor rounds the loss (see _check)
NOISE = 0.1  # how far input values move off the quarter grid


@attrs.frozen
class Outcome:
    seed: int
    kind: str
    reason: str = ""  # refused: the message's shape; bugs: what went wrong
    detail: str = ""
    checked: int = 0  # inputs compared
    skipped: int = 0  # inputs skipped at non-smooth points
    kept: bool = False  # 'ok' with a keeping pair, which matched the plain pair

    @property
    def bug(self) -> bool:
        return self.kind in BUG_KINDS

    def __str__(self) -> str:
        return f"seed {self.seed}: {self.kind}: {self.reason}\n{self.detail}".rstrip()


def refusal_reason(message: str) -> str:
    """The shape of a refusal's message: quoted names and numbers elided, first line only."""
    first = message.strip().splitlines()[0].replace("caller's", "caller")
    first = re.sub(r"^(<[^>]*>:\d+:\d+: )?error: ", "", first)
    first = re.sub(r"the gradient of '[^']*'(, statement '.*?')?: ", "", first)
    first = re.sub(r"'[^']*'", "'_'", first)
    first = re.sub(r"\b\d+\b", "#", first)
    return first[:100]


def float64_args(case: Case, rng: np.random.Generator) -> list:
    """The case's inputs with floating-point ones as float64, moved off the quarter grid."""
    args = []
    for i in case.program.inputs:
        value = case.values[i.name]
        if N.is_float(i.type):
            value = np.asarray(value, np.float64)
            value = value + rng.uniform(-NOISE, NOISE, value.shape)
            value = float(value) if not i.dims else value
        args.append(value)
    return args


def _call(fn, args):
    out = fn(*args, schedule=None)
    return out if isinstance(out, tuple) else (out,)


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    return next((f"{f.filename.split('/tcstage/')[-1]}:{f.lineno} in {f.name}"
                 for f in reversed(tb) if "/tcstage/" in f.filename), "")


def check(case: Case, seed_values: int | None = None) -> Outcome:
    """The gradient oracle's verdict on one case (see the module's docstring)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return _check(case, case.seed if seed_values is None else seed_values)


def _check(case: Case, seed_values: int) -> Outcome:
    seed = case.seed
    source = retype_source(case.source, FLOAT64)
    try:
        prog = tc.define(source)
    except Exception as e:  # noqa: BLE001 - the retyped forward itself
        return Outcome(seed, "forward", "define", f"{type(e).__name__}: {e}")
    try:
        bw = backward(prog, case.name)
    except tc.TCError as e:
        text = str(e)
        if "not a valid TC" in text:
            return Outcome(seed, "invalid", refusal_reason(text.split("(", 1)[-1]), text)
        return Outcome(seed, "refused", refusal_reason(text), text)
    except Exception as e:  # noqa: BLE001 - that is the finding
        return Outcome(seed, "crash", f"{type(e).__name__} in backward [{_where(e)}]",
                       traceback.format_exc())

    rng = np.random.default_rng(seed_values)
    fn = prog[case.name]
    args = float64_args(case, rng)
    try:
        outs = _call(fn, args)
    except Exception as e:  # noqa: BLE001
        return Outcome(seed, "forward", "run", f"{type(e).__name__}: {e}")
    if not all(np.all(np.isfinite(o)) for o in outs):
        return Outcome(seed, "forward", "non-finite")
    d_outs = []
    for name, o in zip(case.program.outputs, outs):
        o = np.asarray(o)
        d = rng.standard_normal(o.shape) if np.issubdtype(o.dtype, np.floating) else \
            rng.integers(-3, 4, o.shape)
        ref = case.expected.tensors[name]
        if ref.extents == o.shape:
            d = np.where(ref.defined, d, 0)
        d_outs.append(d.astype(o.dtype))

    try:
        bprog = tc.define(bw.source)
        grads = _call(bprog[bw.name], [*args, *outs, *d_outs])
    except tc.TCError as e:
        return Outcome(seed, "backward-error", refusal_reason(str(e)), f"{e}\n{bw.source}")
    except Exception as e:  # noqa: BLE001
        return Outcome(seed, "crash", f"{type(e).__name__} running backward [{_where(e)}]",
                       f"{traceback.format_exc()}\n{bw.source}")
    grads = dict(zip(bw.d_inputs, grads))

    def loss(k, direction, step):
        moved = list(args)
        moved[k] = args[k] + step * direction
        return sum(float(np.sum(d.astype(np.float64) * np.asarray(o, np.float64)))
                   for d, o in zip(d_outs, _call(fn, moved)))

    scale = sum(float(np.sum(np.abs(d.astype(np.float64) * np.asarray(o, np.float64))))
                for d, o in zip(d_outs, outs))
    # (retyping makes every declared float a double, but a float computed from integers,
    # `atan(Y(q))`, stays float32: where one does, the loss carries float32 round-off, which
    # a step of 1e-6 would magnify past any tolerance; larger steps keep it small, and the
    # coarse/fine agreement below still rejects curvature)
    single = any(t.type.is_float and t.type.bits < 64 for t in fn.checked.tensors.values())
    step = EPS32 if single else EPS
    # (allowed round-off of the loss: 45 ulp of a double, 1e-14, as ever; 4 ulp of a float,
    # each evaluation rounding every element of a float32 tensor once or twice)
    ulps = 4 * float(np.finfo(np.float32).eps) if single else 1e-14
    checked = skipped = 0
    for k, i in enumerate(case.program.inputs):
        if not N.is_float(i.type):
            continue
        direction = rng.standard_normal(np.shape(args[k])) if i.dims else 1.0
        coarse = (loss(k, direction, step) - loss(k, direction, -step)) / (2 * step)
        fine = (loss(k, direction, step / 10) - loss(k, direction, -step / 10)) / (step / 5)
        roundoff = ulps * (scale + 1) / (step / 10)
        if not np.isfinite(fine) or abs(coarse - fine) > 1e-3 * max(abs(coarse), abs(fine)) \
                + 10 * roundoff:
            skipped += 1
            continue
        checked += 1
        if i.name not in grads:
            if abs(fine) > 10 * roundoff + 1e-9:
                return Outcome(seed, "missing", f"no gradient for {i.name}",
                               f"central difference {fine!r}\n{bw.source}", checked, skipped)
            continue
        analytic = float(np.sum(np.asarray(grads[i.name], np.float64) * direction))
        if abs(analytic - fine) > 1e-4 * max(abs(analytic), abs(fine)) + 10 * roundoff + 1e-9:
            return Outcome(seed, "mismatch", f"d_{i.name}",
                           f"<d_{i.name}, v> = {analytic!r}, central difference {fine!r} "
                           f"(eps {step / 10}; {coarse!r} at eps {step})\n{bw.source}",
                           checked, skipped)
    pair = _check_keeping(case, prog, args, outs, d_outs, grads)
    if isinstance(pair, Outcome):
        return attrs.evolve(pair, checked=checked, skipped=skipped)
    return Outcome(seed, "ok", checked=checked, skipped=skipped, kept=pair)


def _check_keeping(case: Case, prog, args, outs, d_outs, grads) -> Outcome | bool:
    """The pair tcstage.torch uses where autograd records a call (`tcstage.grad.keeping`): its
    forward must return the forward's outputs, and its backward, given the reductions that
    forward kept, the gradients of the plain backward (both in float64: equal to round-off).
    None where they do, or where the function has no such pair."""
    seed = case.seed
    try:
        pair = keeping(prog, case.name)
        if pair is None:
            return False
        kept_fn = tc.define(pair.forward_source)[pair.forward_name]
        results = _call(kept_fn, args)
        n = len(outs)
        bw = pair.backward
        kept_grads = _call(tc.define(bw.source)[bw.name], [*args, *results, *d_outs])
    except tc.TCError as e:
        return Outcome(seed, "keep-error", refusal_reason(str(e)), str(e))
    except Exception as e:  # noqa: BLE001 - that is the finding
        return Outcome(seed, "crash", f"{type(e).__name__} in keeping [{_where(e)}]",
                       traceback.format_exc())
    for name, o, r in zip(case.program.outputs, outs, results[:n]):
        if not np.allclose(np.asarray(r, np.float64), np.asarray(o, np.float64), rtol=1e-9,
                           atol=1e-12, equal_nan=True):
            return Outcome(seed, "keep-mismatch", f"output {name}",
                           f"the keeping forward's {name} differs\n{pair.forward_source}")
    for i_name, g in zip(bw.d_inputs, kept_grads):
        d_name, plain = bw.d_inputs[i_name], grads.get(i_name)
        if plain is None or not np.allclose(np.asarray(g, np.float64),
                                            np.asarray(plain, np.float64), rtol=1e-9,
                                            atol=1e-12, equal_nan=True):
            return Outcome(seed, "keep-mismatch", d_name,
                           f"the kept backward's {d_name} differs from the plain one's\n"
                           f"kept {bw.kept}\n{bw.source}")
    return True


def fails_like(outcome: Outcome):
    """A predicate for minimize.minimize: does a case give a bug of the same kind (and, for
    all but mismatches, the same reason)?"""
    def fails(case: Case) -> bool:
        got = check(case, outcome.seed)
        return got.kind == outcome.kind and (outcome.kind in ("mismatch", "missing")
                                             or got.reason == outcome.reason)
    return fails
