"""The narrow-type fuzz cases (tests/fuzz/narrow.py) that found bugs, each under the options
that showed it, emulated and compared with float64 numpy within the generator's error bound:
they keep the generator and its bounds working, and the bugs fixed. The campaign itself is
`python3 benchmarks/fuzz_campaign.py narrow --programs 300`."""

from __future__ import annotations

import attrs
import pytest

from fuzz import narrow


@pytest.mark.parametrize("seed,option", [
    (37, 2),  # bf16 matmul with a bias: no thread band, a block rounded up to a warp
    (54, 1),  # half in/out +=, M = 1: the same
    (141, 0),  # half nn, mapToBlocks(3) untiled: tensor-core tiles over other blocks' rows
])
def test_narrow_case_matches_float64(seed, option):
    case = narrow.case(seed)
    case = attrs.evolve(case, options=(case.options[option],))
    assert narrow.check(case, cpu=False) == []
