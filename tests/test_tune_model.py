"""The static cost model (tcstage/tune/model.py): counts against hand computations, rankings
that any sensible model must get right, and its speed on the paper's kernels."""

import pathlib
import time
import warnings

import attrs
import pytest

import tcstage as tc
from tcstage.compiler import compile_cuda
from tcstage.errors import TCError
from tcstage.tune.model import H100, H200, Device, device_by_name, predict

ROOT = pathlib.Path(__file__).resolve().parents[1]
TMM = (ROOT / "examples" / "tmm.tc").read_text()
ADD = "def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }"


def _compile(source, name, shapes, options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        return compile_cuda(tc.define(source)[name], shapes, None, options)


def _paper_cases():
    out = []
    for line in (ROOT / "schedules" / "paper-manual.txt").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, where, sizes, options = (part.strip() for part in line.split("|"))
        file, function = where.split(":")
        sizes = {k.strip(): int(v) for k, v in (s.split("=") for s in sizes.split(","))}
        out.append((name, file, function, sizes, options))
    return out


def test_elementwise_add_counts_by_hand():
    # N = 4096 floats, 128 threads per block, one element per thread: each of the 3 accesses
    # (A, B read, C written) is 4096 / 32 = 128 warp accesses of 32 contiguous floats = 4
    # sectors of 32 bytes; one add per element
    c = _compile(ADD, "add", [(4096,), (4096,)],
                 tc.MappingOptions().tile(128).mapToThreads(128).mapToBlocks(32))
    assert c.mapped.block == (128, 1, 1) and c.mapped.grid == (32, 1, 1)
    p = predict(c)
    assert p.global_instructions == 3 * 128
    assert p.global_transactions == 3 * 128 * 4
    assert p.global_bytes == 3 * 4096 * 4
    assert p.dram_bytes == 3 * 4096 * 4
    assert p.flops == 4096
    assert p.shared_accesses == 0
    assert (p.threads_per_block, p.blocks) == (128, 32)


def test_coalescing_thread_x_on_contiguous_vs_strided_dimension():
    # tmm at M = N = K = 256, no promotion. C(m,n) +=! A(m,kk) * B(n,kk): S1 has 256^3
    # instances = 524288 warp accesses per reference, S0 (C = 0) 256^2 / 32 = 2048.
    # x on n: A broadcast 1 sector, B stride K: 32, C read and written contiguously: 4 + 4.
    # x on m (y = 32 threads, x = 1): A stride K: 32, B broadcast: 1, C stride N: 32 + 32.
    shapes = [(256, 256), (256, 256)]
    on_n = _compile(TMM, "tmm", shapes, "MappingOptions().tile(32, 32).mapToThreads(32, 1)"
                    ".mapToBlocks(8, 8)")
    on_m = _compile(TMM, "tmm", shapes, "MappingOptions().tile(32, 32).mapToThreads(1, 32)"
                    ".mapToBlocks(8, 8)")
    assert on_n.mapped.block == (32, 1, 1) and on_m.mapped.block == (1, 32, 1)
    pn, pm = predict(on_n), predict(on_m)
    assert pn.global_transactions == 524288 * (1 + 32 + 4 + 4) + 2048 * 4
    assert pm.global_transactions == 524288 * (32 + 1 + 32 + 32) + 2048 * 32
    assert pm.global_instructions == pn.global_instructions == 524288 * 4 + 2048
    assert pm.time > pn.time


def test_naive_mapping_is_predicted_far_slower_than_the_papers():
    shapes = [(128, 1024), (1024, 1024)]
    naive = predict(_compile(TMM, "tmm", shapes, tc.MappingOptions()))
    manual = dict((c[0], c[4]) for c in _paper_cases())["tmm-medium"]
    tiled = predict(_compile(TMM, "tmm", shapes, manual))
    assert naive.threads_per_block == 1 and naive.blocks == 1
    assert naive.bound == "latency"
    assert naive.time > 50 * tiled.time


def test_shared_bank_conflicts_of_an_unpadded_buffer():
    # tmm-small under the paper's options: S1 reads shared_B[n - 32 b1][kk] with threadIdx.x on n, so neighbouring
    # threads are a row apart: 33 words in the padded buffer (33 mod 32 = 1, no conflict), 32
    # in an unpadded one (every thread in the same bank: 32-way). S1 runs 128 * 256 * 32
    # instances, 32768 warp accesses; the other shared accesses (copies along a row, shared_A
    # broadcast) are conflict-free either way.
    paper = ("MappingOptions().tile(4, 32).mapToThreads(32, 1).mapToBlocks(32, 8)"
             ".useSharedMemory(True).usePrivateMemory(True).unroll(4)")  # Appendix A.4's
    padded = _compile(TMM, "tmm", [(128, 32), (256, 32)], paper)
    promotions = padded.promoted.promotions
    assert [(p.tensor, p.padded) for p in promotions if p.memory == "shared"] == \
        [("A", (4, 33)), ("B", (32, 33))]
    unpadded = attrs.evolve(padded, promoted=attrs.evolve(padded.promoted, promotions=tuple(
        attrs.evolve(p, padded=p.sizes) for p in promotions)))
    pp, pu = predict(padded), predict(unpadded)
    assert pp.bank_conflict_factor == 1.0
    assert pu.shared_accesses == pp.shared_accesses
    assert pu.shared_wavefronts - pp.shared_wavefronts == 31 * 32768
    assert pu.time > pp.time


def test_registers_limit_occupancy():
    # 256 threads (8 warps) per block. 32 registers: 8 blocks by the 2048 threads of an SM,
    # 64 warps, occupancy 1. 128 registers: 128 * 32 = 4096 per warp, 65536 / 4096 = 16 warps,
    # 2 blocks, occupancy 16 / 64 = 0.25. 255: 8192 per warp (granularity 256), 8 warps,
    # one block, 0.125.
    c = _compile(ADD, "add", [(1 << 20,), (1 << 20,)],
                 tc.MappingOptions().tile(256).mapToThreads(256).mapToBlocks(4096))
    assert c.mapped.block == (256, 1, 1)
    low, mid, high = (predict(c, resources={"registers": r, "shared": 0})
                      for r in (32, 128, 255))
    assert (low.blocks_per_sm, low.occupancy) == (8, 1.0)
    assert (mid.blocks_per_sm, mid.occupancy) == (2, 0.25)
    assert (high.blocks_per_sm, high.occupancy) == (1, 0.125)
    assert high.waves == -(-4096 // 132) and low.waves == -(-4096 // (132 * 8))
    assert high.time >= mid.time >= low.time


def test_too_much_shared_memory_cannot_launch():
    c = _compile(ADD, "add", [(4096,), (4096,)],
                 tc.MappingOptions().tile(128).mapToThreads(128).mapToBlocks(32))
    p = predict(c, resources={"registers": 32, "shared": 228 * 1024})
    assert p.time == float("inf") and p.occupancy == 0


def test_predict_is_fast_on_the_papers_kernels():
    slowest = 0.0
    for name, file, function, sizes, options in _paper_cases():
        source = (ROOT / "examples" / file).read_text()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tc.TCWarning)
            fn = tc.define(source)[function]
        shapes = [tuple(sizes[d] if not d.isdigit() else int(d) for d in t.dims)
                  for t in fn.checked.inputs]
        c = _compile(source, function, shapes, options)
        start = time.perf_counter()
        p = predict(c)
        took = time.perf_counter() - start
        slowest = max(slowest, took)
        assert took < 0.5, (name, took)
        assert 0 < p.time < 1, name
        assert p.flops > 0 and p.global_transactions > 0, name
        assert p.describe().startswith("predicted")
    assert slowest < 0.5


def test_device_figures():
    # NVIDIA H100 SXM5 datasheet figures
    assert H100.sms == 132
    assert H100.dram_bandwidth == pytest.approx(3.35e12)
    assert H100.fp32_flops == pytest.approx(67e12, rel=0.01)
    assert H100.shared_per_sm == 228 * 1024 and H100.shared_per_block == 227 * 1024
    assert H100.registers_per_sm == 64 * 1024
    assert H100.max_threads_per_sm == 2048 and H100.max_blocks_per_sm == 32
    assert H100.compute_capability == (9, 0)
    # the FP32 peak is the SMs' FMA lanes at the boost clock
    assert H100.fp32_flops == pytest.approx(H100.sms * 128 * 2 * H100.clock, rel=0.01)
    assert device_by_name("H100") is H100 and device_by_name("NVIDIA H200") is H200
    assert H200.dram_bandwidth == pytest.approx(4.8e12) and H200.sms == 132
    assert isinstance(H100, Device)
    with pytest.raises(TCError, match="unknown device 'V100'"):
        device_by_name("V100")


def test_more_dram_bandwidth_is_not_slower():
    c = _compile(ADD, "add", [(1 << 22,), (1 << 22,)],
                 tc.MappingOptions().tile(256).mapToThreads(256).mapToBlocks(16384))
    h100, h200 = predict(c, H100), predict(c, H200)
    assert h100.bound == "memory"
    assert h200.time < h100.time


def test_copy_of_a_clamped_read_in_pieces_stays_bounded():
    """A shared copy of a boundary-conditioned input has its domain in several pieces; the
    coalescing analysis of one copy once took every byte of memory there (isl in
    is_singleton, under `tcstage compare` of a Halide pipeline). It now finishes quickly."""
    import halide as hl
    import numpy as np

    inp = hl.ImageParam(hl.Float(32), 2, "inp")
    x, y = hl.Var("x"), hl.Var("y")
    edge = hl.BoundaryConditions.repeat_edge(inp)
    out = hl.Func("out")
    out[x, y] = edge[x - 1, y] + 2 * edge[x, y + 1]
    f = tc.from_halide(out, name="shift")
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        kernel = tc.compile(f, a, output_shape=(4, 5), options=tc.MappingOptions.named("mlp"),
                            target="cuda-emulated")
    start = time.perf_counter()
    predicted = predict(kernel.compiled)
    assert time.perf_counter() - start < 20
    assert 0 < predicted.time < 1e-3
