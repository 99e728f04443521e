"""The gradient oracle (tests/fuzz/gradient.py) on a fixed sample of random well-formed TC
functions: each is retyped to float64, differentiated by tc.gradient, and the backward TC's
gradients are compared with central differences of the forward along random directions.
benchmarks/fuzz_campaign.py's `gradient` mode runs the long campaign.

A documented refusal (TCError from tc.gradient) is fine; a generated backward that is not a
valid TC, an exception other than TCError, or a gradient that disagrees is a failure.
"""

import attrs
import pytest

from fuzz import gradient, programs

SEEDS = range(0, 48)


@pytest.fixture(scope="module")
def outcomes():
    return {s: gradient.check(programs.case(s, gradient.FEATURES)) for s in SEEDS}


@pytest.mark.parametrize("seed", SEEDS)
def test_gradient_matches_central_differences(outcomes, seed):
    outcome = outcomes[seed]
    assert not outcome.bug, f"{outcome}\n{programs.case(seed, gradient.FEATURES).source}"


def test_the_sample_checks_gradients(outcomes):
    """The sample is not all refusals: many programs get their inputs' gradients compared."""
    ok = [o for o in outcomes.values() if o.kind == "ok" and o.checked]
    assert len(ok) >= 12, {s: o.kind for s, o in outcomes.items()}
    assert sum(o.checked for o in ok) >= 20


def _scaled_backward(monkeypatch, factor: str) -> None:
    """Makes the generated backwards read the gradient of output O0 `factor` times too large."""
    real = gradient.backward

    def scaled(program, name):
        bw = real(program, name)
        return attrs.evolve(bw, source=bw.source.replace("d_O0(", f"{factor} * d_O0("))
    monkeypatch.setattr(gradient, "backward", scaled)


def test_the_oracle_catches_a_wrong_gradient(monkeypatch):
    """A backward that reads the gradient of an output 1.5 times too large is reported."""
    _scaled_backward(monkeypatch, "1.5")
    outcome = gradient.check(programs.case(1, gradient.FEATURES))
    assert outcome.kind == "mismatch", str(outcome)


@pytest.mark.parametrize("seed", [971618, 970826, 971216])
def test_float32_tensors_of_integer_values_get_float32_steps(seed):
    """A float computed from integers stays float32 after retyping (`atan(Y(q, q))`): its
    round-off made central differences at a double's step disagree with the exact gradient
    (campaign seeds 970826, 971216, 971618). Larger steps and a float32 round-off allowance
    check them, and still catch a gradient 2% off (971618's d_O0)."""
    outcome = gradient.check(programs.case(seed, gradient.FEATURES))
    assert outcome.kind == "ok" and outcome.checked, str(outcome)


def test_the_float32_allowance_still_catches_a_wrong_gradient(monkeypatch):
    _scaled_backward(monkeypatch, "1.02")
    outcome = gradient.check(programs.case(971618, gradient.FEATURES))
    assert outcome.kind == "mismatch", str(outcome)


def test_a_gradient_comparing_erf_values_compiles_seed_975319():
    """The backward of fuzz seed 975319 compares erf's values (`O0_values == O0_max`, a
    maximum's tie test) of a read of another gradient's tensor: with double erf spelled out as
    a 136-term series, Halide's bounds inference never finished compiling it. Double erf is a
    call of the C library's now; the gradient is checked against central differences."""
    case = programs.case(975319, gradient.FEATURES)
    assert "erf(" in case.source
    outcome = gradient.check(case)
    assert outcome.kind == "ok" and outcome.checked, outcome


def test_double_erf_is_the_c_librarys():
    """float64 erf against math.erf, at the tails, signed zeros, infinities and NaN."""
    import math
    import numpy as np
    import tcstage as tc
    f = tc.define("def e(double(N) X) -> (Y) { Y(i) = erf(X(i)) }").e
    x = np.array([-7.0, -6.0, -1.5, -1e-300, -0.0, 0.0, 1e-300, 0.3, 2.5, 5.9, 6.1, 30.0,
                  np.inf, -np.inf, np.nan])
    y = f(x)
    want = np.array([math.erf(v) for v in x[:-1]] + [math.nan])
    np.testing.assert_array_equal(y, want)
    assert math.copysign(1.0, y[4]) == -1.0  # erf(-0) = -0
