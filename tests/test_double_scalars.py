"""Double scalar inputs keep their value (Halide's Python Param.set rounded them to float32)."""

import numpy as np

import tcstage as tc

SRC = "def scale(double(N) X, double a) -> (Y) { Y(i) = X(i) * a }"


def test_double_scalar_exact_on_cpu():
    y = tc.define(SRC).scale(np.ones(3), 0.7)
    assert y.tolist() == [0.7, 0.7, 0.7]  # float32 rounding gave 0.699999988079071


def test_double_scalar_exact_under_emulation():
    k = tc.compile(SRC, "scale", np.ones(3), 0.7, target="cuda-emulated",
                   options=tc.MappingOptions().mapToThreads(3))
    assert k(np.ones(3), 0.7).tolist() == [0.7, 0.7, 0.7]
