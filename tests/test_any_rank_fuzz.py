"""Random rank-polymorphic programs: the differential generator's programs lifted over a `...`
run (tests/fuzz/polymorphic.py), at runs of length 0 to 3, on the CPU and emulated, every slice
against the reference."""

import random

import pytest

import tcstage as tc
from fuzz import mapping, polymorphic, programs

RUNS = [(), (2,), (2, 1), (1, 2, 2)]


def _check(seed: int, emulate: bool) -> list[str]:
    case = programs.case(seed, programs.CORE_FEATURES)
    rng = random.Random(seed)
    run = RUNS[seed % len(RUNS)]
    options = [mapping.random_options(rng)] if emulate else []
    return polymorphic.check(case, run, options)


def test_lifting_writes_the_run_everywhere():
    source = "def f(float(N, M) A, float s) -> (O, S) {\n O(i) +=! A(i, j) * s\n S() = O(0)\n}"
    assert polymorphic.lift(source) == (
        "def f(float(..., N, M) A, float s) -> (O, S) {\n O(..., i) +=! A(..., i, j) * s\n"
        " S(...) = O(..., 0)\n}")
    assert polymorphic.lift("def f(float(N) A) -> (O) { O(i) = A(i) * A.0 }") is None


@pytest.mark.parametrize("seed", range(12))
def test_lifted_programs_on_the_cpu(seed):
    assert _check(71000 + seed, emulate=False) == []


@pytest.mark.parametrize("seed", range(4))
def test_lifted_programs_emulated(seed):
    assert _check(71100 + seed, emulate=True) == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(60))
def test_lifted_programs_campaign(seed):
    assert _check(71200 + seed, emulate=seed % 3 == 0) == []
