"""The isl scheduler with TC's fusion strategies: every schedule respects every dependence, and
the strategies fuse as documented."""

import warnings
from pathlib import Path

import pytest

import tcstage as tc
from tcstage.poly.schedule import coincident_members, compute_schedule, outer_band, respects
from tcstage.poly.scop import extract_scop

EXAMPLES = Path(__file__).parent.parent / "examples"
SIZES = {"M": 12, "N": 8, "K": 5, "B": 3, "O": 6, "P": 4, "Q": 2, "IP": 2, "OP": 3, "H": 6,
         "W": 7, "KH": 3, "KW": 2, "C": 2, "E1": 10, "E2": 9, "D": 4, "L1": 3, "L2": 2}


def scop(name, source):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        fn = tc.define(source)[name]
    return extract_scop(fn.lower(), SIZES)


KERNELS = [("tmm", "tmm.tc"), ("MLP1", "mlp.tc"), ("MLP3", "mlp.tc"), ("conv2d", "conv.tc"),
           ("maxpool2x2", "conv.tc"), ("2LUT", "lut.tc")]


@pytest.mark.parametrize("fusion", ["Max", "Preserve3Coincident", "Min"])
@pytest.mark.parametrize("name, file", KERNELS)
def test_schedules_respect_all_dependences(name, file, fusion):
    s = scop(name, (EXAMPLES / file).read_text())
    schedule = compute_schedule(s, fusion)
    assert respects(schedule, s.dependences().all)
    assert schedule.get_domain().is_equal(s.domain)


def test_max_fuses_mlp3_on_the_batch_and_min_does_not():
    s = scop("MLP3", (EXAMPLES / "mlp.tc").read_text())
    fused = outer_band(compute_schedule(s, "Max"))
    assert fused is not None and coincident_members(fused) >= 1
    assert outer_band(compute_schedule(s, "Min")) is None


def test_tmm_keeps_its_parallel_band():
    s = scop("tmm", (EXAMPLES / "tmm.tc").read_text())
    band = outer_band(compute_schedule(s, "Preserve3Coincident"))
    assert band.band_n_member() >= 2 and coincident_members(band) >= 2


def test_unknown_strategy():
    s = scop("tmm", (EXAMPLES / "tmm.tc").read_text())
    with pytest.raises(tc.TCError, match="unknown fusion strategy 'Fastest'"):
        compute_schedule(s, "Fastest")
