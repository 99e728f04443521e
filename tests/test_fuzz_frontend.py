"""Front-end fuzzing: whatever the text, `tc.define` returns a Program or raises a `TCError`,
within a few seconds. Inputs: arbitrary text and bytes, token soup in the shape of a TC
function, syntactically valid TC with random meaning, and mutants of the examples and of
generated programs (tests/fuzz/frontend.py).

CI runs a fixed, derandomized sample; TCSTAGE_FUZZ_EXAMPLES=5000 explores more locally, and
benchmarks/fuzz_campaign.py runs the long campaign (1e5 inputs, each in a killable process).
"""

import os
import warnings

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import tcstage as tc
from fuzz import frontend
from fuzz.limits import time_limit

EXAMPLES = int(os.environ.get("TCSTAGE_FUZZ_EXAMPLES", "100"))
TIME_LIMIT_S = 5

# Deterministic (derandomized, no example database) and bounded: no shrinking, so a failure
# costs no more time than a pass; the input is reported as generated.
fuzz_settings = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 100,
                         database=None, phases=(Phase.explicit, Phase.generate),
                         suppress_health_check=list(HealthCheck))


def assert_defines_or_rejects(source) -> None:
    with warnings.catch_warnings(), time_limit(TIME_LIMIT_S, "tc.define"):
        warnings.simplefilter("ignore")
        try:
            tc.define(source)
        except tc.TCError as e:
            assert str(e), "a TCError without a message"


@fuzz_settings
@given(st.one_of(st.text(max_size=300),
                 st.binary(max_size=300).map(lambda b: b.decode("utf-8", "surrogateescape")),
                 st.randoms(use_true_random=False).map(frontend.random_text)))
def test_random_text_defines_or_raises_tcerror(text):
    assert_defines_or_rejects(text)


@fuzz_settings
@given(st.randoms(use_true_random=False).map(frontend.token_soup))
def test_token_soup_defines_or_raises_tcerror(text):
    assert_defines_or_rejects(text)


@fuzz_settings
@given(st.randoms(use_true_random=False).map(frontend.grammar_tc))
def test_random_meaning_defines_or_raises_tcerror(text):
    assert_defines_or_rejects(text)


@fuzz_settings
@given(st.randoms(use_true_random=False).map(frontend.mutant))
def test_mutated_programs_define_or_raise_tcerror(text):
    assert_defines_or_rejects(text)


@fuzz_settings
@given(st.one_of(st.none(), st.integers(), st.binary(max_size=50),
                 st.binary(max_size=50).map(lambda b: b"def f(float(N) A) -> (B) {\n" + b),
                 st.lists(st.text(max_size=5), max_size=3)))
def test_sources_that_are_not_text_raise_tcerror(source):
    assert_defines_or_rejects(source)
