"""Findings of the Halide pipeline fuzz campaign (benchmarks/fuzz_campaign.py halide), each
minimized, against Halide's own realize; and a smoke run of the generator
(tests/fuzz/halide_pipelines.py) on a few fixed seeds."""

import warnings

import halide as hl
import numpy as np
import pytest

import tcstage as tc

x = hl.Var("x")


def realized(build, args: dict, shape) -> np.ndarray:
    """Halide's realize of a fresh copy of the pipeline."""
    outs, params = build()
    for name, value in args.items():
        params[name].set(hl.Buffer(value) if isinstance(value, np.ndarray) else value)
    return np.array(hl.Pipeline(outs).realize(list(reversed(shape))))


def emulated(build, args: dict, shape) -> np.ndarray:
    outs, _ = build()
    f = tc.from_halide(outs)
    values = [args[a.name] for a in f.arguments]
    return tc.compile(f, *values, output_shape=shape, target="cuda-emulated")(*values)


def test_narrow_integer_sum_wraps_before_max():
    """Seed 19: Halide computes a uint8 sum in uint8 (it wraps); C promotes it to int, so the
    kernel compared 300 where Halide compares 44 and stored the wrong operand of max."""
    def build():
        im = hl.ImageParam(hl.UInt(8), 1, "im")
        s = hl.ImageParam(hl.Int(16), 1, "s")
        f = hl.Func("f")
        f[x] = hl.max(im[x] + hl.u8(200), hl.u8(100)) \
            + hl.u8(hl.select(s[x] * hl.i16(300) > 0, 1, 0))  # an int16 product wraps too
        return [f], {"im": im, "s": s}

    args = {"im": np.array([100, 10, 50, 0, 255], np.uint8),
            "s": np.array([200, -200, 1, 0, 110], np.int16)}
    expected = realized(build, args, (5,))
    # (100 + 200) % 256 < 100; 200 * 300 and 110 * 300 wrap below 0, -200 * 300 above
    assert expected.tolist() == [100, 211, 251, 200, 199]
    np.testing.assert_array_equal(emulated(build, args, (5,)), expected)


@pytest.mark.parametrize("seed", [0, 1, 2, 7])
def test_fuzz_generator_smoke(seed):
    """The generator makes a valid pipeline Halide realizes, and tcstage agrees with it on the
    CPU (its default schedule, both calls) and emulated (default MappingOptions)."""
    from fuzz import halide_pipelines as H

    case = H.case(seed)
    assert case.source.startswith("import halide as hl") and len(case.calls) == 2
    assert all(len(call.shapes) in (1, 2) for call in case.calls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        findings = H.check(case, [tc.MappingOptions()], schedules=("auto",))
    assert findings == []


def test_output_needed_beyond_its_box_says_why_on_both_paths():
    """Seeds 6 and 10: an output that another output reads below 0, or whose histogram update
    writes past the box asked for. The CPU call raised Halide's own message after compiling
    ("Output buffer g$3 is accessed at -2"), and tc.compile blamed updates that g lacks."""
    im = hl.ImageParam(hl.Int(32), 1, "im")
    g, h = hl.Func("g"), hl.Func("h")
    g[x] = hl.BoundaryConditions.repeat_edge(im)[x] * 2
    h[x] = g[x - 2] + g[x]
    f = tc.from_halide([h, g])
    a = np.arange(8, dtype=np.int32)
    with pytest.raises(tc.TCError, match=r"output 'g' of 'h' is needed over \[-2\.\.5\].*"
                                         r"'h' read it there"):
        f(a, output_shape=[(6,), (6,)])
    with pytest.raises(tc.TCError, match=r"output 'g' .*'h' read it there"):
        tc.compile(f, a, output_shape=[(6,), (6,)], target="cuda-emulated")
    hist = hl.Func("hist")
    r = hl.RDom([(0, 8)])
    hist[x] = 0
    hist[hl.clamp(im[r.x], 0, 7)] += 1
    f = tc.from_halide(hist)
    with pytest.raises(tc.TCError, match=r"output 'hist' .*over \[0\.\.7\].*beyond its "
                                         r"output_shape \(3,\): its updates write there"):
        f(a, output_shape=(3,))
    np.testing.assert_array_equal(f(a, output_shape=(8,)), np.ones(8, np.int32))


def test_product_update_over_an_rdom_variable_the_body_does_not_use():
    """Seed 371 (issue 27): a uint8 `*` update over a 2 x 2 RDom whose x the body never reads
    raced under emulation: two instances that differ in that x alone update one element, so
    they may not run at once unless combined as a reduction. Under drawn options the kernel
    equals Halide's realize (campaigns since run it clean under 12 option sets)."""
    import random

    from fuzz import mapping

    def build():
        y, z = hl.Var("y"), hl.Var("z")
        im = hl.ImageParam(hl.Int(16), 3, "im")
        f = hl.Func("f")
        r = hl.RDom([(1, 2), (1, 2)])
        f[x, y, z] = hl.u8(9)
        factor = hl.clamp(hl.u8(im[x, y + r.y, z // 2]), hl.u8(0), hl.u8(15)) * \
            hl.clamp(hl.u8(im[x + r.y, y + 2, z // 2]), hl.u8(0), hl.u8(15))
        f[x, y, z] = f[x, y, z] * hl.clamp(factor, hl.u8(0), hl.u8(2))
        return [f], {"im": im}

    args = {"im": np.random.default_rng(371).integers(-3, 20, (3, 8, 9)).astype(np.int16)}
    shape = (5, 4, 7)
    expected = realized(build, args, shape)
    assert (expected != 9).any()  # (the updates change values)
    outs, _ = build()
    f = tc.from_halide(outs)
    rng = random.Random("seed 371")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        for _ in range(6):
            kernel = tc.compile(f, args["im"], output_shape=shape, target="cuda-emulated",
                                options=mapping.random_options(rng))
            np.testing.assert_array_equal(kernel(args["im"]), expected)


def test_every_launch_of_a_four_launch_kernel_runs():
    """Seed 950132 (issue 26): under mapToBlocks(3, 4) this chain compiles to four launches, and
    98 of 231 outputs were wrong under emulation because the host compiler deleted the call in
    one launch's launcher (tests/test_emulation.py has the reduced kernel and the cause)."""
    y = hl.Var("y")

    def build():
        in0 = hl.ImageParam(hl.Int(32), 2, "in0")
        edge = hl.BoundaryConditions.repeat_edge(in0)
        i16, u8 = hl.Int(16), hl.UInt(8)
        f0, f1, f2, f3 = (hl.Func(f"f{i}") for i in range(4))
        # each stage is undefined, then updated over a one-point RDom, as the generator writes
        f0[x, y] = hl.undef(u8)
        f0[x, y] = hl.cast(u8, hl.max(hl.cast(i16, edge[2 * x + 1, y - 2]) // hl.i16(3),
                                      hl.i16(5))) + hl.cast(u8, hl.RDom([(0, 1)]).x)
        f1[x, y] = (hl.cast(u8, f0[hl.clamp(x - 2, 0, 3), y + 2])
                    + hl.cast(u8, f0[x // 2, hl.clamp(y - 1, 0, 16)])
                    + hl.max(hl.cast(u8, edge[x - 2, hl.clamp(y + 2, 0, 16)]),
                             hl.cast(u8, edge[x - 2, y])))
        f2[x, y] = hl.undef(i16)
        f2[x, y] = hl.clamp(hl.select(hl.cast(i16, y) < hl.i16(2), hl.cast(i16, f1[x + 1, y - 2]),
                                      hl.cast(i16, f1[x - 2, y]))
                            + (hl.cast(i16, f1[x, y + 2]) - hl.cast(i16, f1[x, 2 * y])),
                            hl.i16(-100), hl.i16(100)) + hl.cast(i16, hl.RDom([(0, 1)]).x)
        f3[x, y] = hl.clamp(hl.cast(hl.Int(32), hl.abs((x + hl.cast(hl.Int(32), f2[x // 2, y])) % -3)),
                            -100, 100)
        return [f3], {"in0": in0}

    args = {"in0": np.random.default_rng(950132).integers(-8, 9, (3, 13)).astype(np.int32)}
    shape = (7, 33)
    expected = realized(build, args, shape)
    outs, _ = build()
    f = tc.from_halide(outs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        kernel = tc.compile(f, args["in0"], output_shape=shape, target="cuda-emulated",
                            options=tc.MappingOptions().mapToBlocks(3, 4))
    assert len(kernel.launches) >= 2
    np.testing.assert_array_equal(kernel(args["in0"]), expected)


def test_an_output_halide_bounds_past_its_box_is_refused_in_numpy_terms():
    """Seed 319 (issue 27): the histogram's index clamp(1 / f0, 0, 7) takes only 0 and 1 (f0 is
    a uint8, and Halide's 1 / 0 is 0), so tcstage's check, which bounds f0's values, lets an
    output 2 wide through, and the CUDA kernel computes it; Halide's runtime check bounds the
    index expression alone (-1..1) and refuses. The CPU call says so in numpy terms instead of
    passing Halide's text on."""
    y = hl.Var("y")

    def build():
        in0 = hl.ImageParam(hl.Int(16), 2, "in0")
        mirrored = hl.BoundaryConditions.mirror_image(in0)
        f0, f1 = hl.Func("f0"), hl.Func("f1")
        f0[x, y] = hl.cast(hl.UInt(8), mirrored[x, y + 1])
        r = hl.RDom([(0, 7)])
        f1[x, y] = hl.i16(0)
        f1[hl.clamp(1 // hl.cast(hl.Int(32), f0[y + r.x, r.x - 1]), 0, 7), y] += hl.i16(1)
        return [f1], {"in0": in0}

    a = np.array([[1, 0, 1, 1, 3, 1, 0]], np.int16)  # (numpy: 1 row of 7; f0 = a's values)
    f = tc.from_halide(build()[0])
    with pytest.raises(tc.TCArgumentError,
                       match=r"by its bounds, output 'f1' is needed at index -1 along "
                             r"dimension 1 \(numpy order\), outside its output_shape \(33, 2\)"):
        f(a, output_shape=(33, 2))
    # numpy: mirror_image reflects with the edge repeated, period 14 along the row
    period = np.concatenate([a[0], a[0][::-1]])
    expected = np.zeros((33, 2), np.int16)
    for row in range(33):
        for r in range(7):
            v = int(period[(row + r) % 14])
            expected[row, min(max(1 // v if v else 0, 0), 7)] += 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        kernel = tc.compile(f, a, output_shape=(33, 2), target="cuda-emulated")
    np.testing.assert_array_equal(kernel(a), expected)


def test_no_barrier_where_one_thread_runs_a_histogram():
    """Seed 950078 (issue 26): the histogram f1, in no band mapped to threads, runs on thread 0
    of block 0 only; sharedDepth(3) promoted its tile to shared memory there, with barriers the
    other thread never reached (a divergent __syncthreads, undefined on a GPU). Shared memory
    is declined where one thread runs a scope's statements."""
    y, z = hl.Var("y"), hl.Var("z")

    def build():
        in0 = hl.ImageParam(hl.Int(32), 3, "in0")
        in1 = hl.ImageParam(hl.Int(16), 3, "in1")
        in0_b = hl.BoundaryConditions.constant_exterior(in0, hl.i32(2))
        in1_b = hl.BoundaryConditions.constant_exterior(in1, hl.i16(2))
        f1, f3, f4 = hl.Func("f1"), hl.Func("f3"), hl.Func("f4")
        r = hl.RDom([(0, 7)])
        f1[x, y, z] = hl.f32(0.0)
        f1[hl.clamp(hl.cast(hl.Int(32), in1_b[r.x - 1, y + 1, z + 2]) * 2, 0, 3), y, z] += \
            hl.f32(1.0)
        f3[x, y, z] = hl.clamp(in0_b[hl.clamp(x - 1, 0, 6), y, z // 2], -100, 100)
        u8 = hl.UInt(8)
        f4[x, y, z] = (hl.clamp(hl.u8(hl.clamp(f1[x, y // 2, z // 2], 0.0, 255.0)),
                                hl.u8(0), hl.u8(15))
                       * hl.clamp(hl.cast(u8, f3[x + 1, y, z - 2]), hl.u8(0), hl.u8(15)))
        return [f4], {"in0": in0, "in1": in1}

    g = np.random.default_rng(950078)
    args = {"in0": g.integers(-8, 9, (2, 33, 33)).astype(np.int32),
            "in1": g.integers(-3, 4, (13, 3, 17)).astype(np.int16)}
    shape = (1, 2, 5)
    expected = realized(build, args, shape)
    outs, _ = build()
    f = tc.from_halide(outs)
    options = tc.MappingOptions.parse(
        "MappingOptions().tile(2, 1, 1, 3).mapToThreads(33).mapToBlocks(2, 3, 4).unroll(4)"
        ".useSharedMemory(True).usePrivateMemory(True).sharedDepth(3)")
    values = [args[a.name] for a in f.arguments]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.TCWarning)
        kernel = tc.compile(f, *values, output_shape=shape, target="cuda-emulated",
                            options=options)
    np.testing.assert_array_equal(kernel(*values), expected)


def test_clamped_row_read_is_not_a_line_buffer_seed_952095():
    """Seed 952095: f3 reads f2 at the clamped row clamp(y + 2, 0, 6). With f2, f1 and f0 as
    line buffers of f3's strips, Halide 21's sliding window computed one new row of f0 per row
    of f3 after a warm-up too short for f1's five rows, and read rows never computed (3 of 5
    outputs wrong under schedule="tcstage"). A clamped row read now starts strips of its
    own."""
    from fuzz import halide_pipelines as H

    case = H.case(952095)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert H.check(case, (), schedules=("tcstage", "auto")) == []


def test_overlapped_tiles_refuse_tuple_elements_updated_together_seed_952054():
    """Seed 952054, minimized: argmin over a 4x2 window read at two columns. Its Tuple's
    elements are updated together in one reduction loop (the index from the value's previous
    iteration); overlapped tiles run one statement's instances after another's in a tile, so
    the value element's update was left out and 115 of 143 outputs were wrong. Overlapped
    tiles now decline such a group and say why; the kernel equals Halide's realize."""
    y = hl.Var("y")

    def build():
        in0 = hl.ImageParam(hl.Int(32), 2, "in0")
        e = hl.BoundaryConditions.repeat_edge(in0)
        f1, f2 = hl.Func("f1"), hl.Func("f2")
        r = hl.RDom([(-1, 4), (0, 2)], "r")
        f1[x, y] = hl.argmin(r, e[x + r.x, y + r.y])[1]
        f2[x, y] = f1[x + 1, y] * 3 + f1[x - 1, y]
        return [f2], {"in0": in0}

    a = np.random.default_rng(0).integers(-5, 5, (13, 11)).astype(np.int32)
    expected = realized(build, {"in0": a}, (13, 11))
    outs, _ = build()
    f = tc.from_halide(outs)
    k = tc.compile(f, a, output_shape=(13, 11), target="cuda-emulated",
                   options=tc.MappingOptions().tile(8, 4).overlappedTiles(True))
    np.testing.assert_array_equal(k(a), expected)
    assert "updates after it in the same loop (the elements of a Tuple)" in k.explain()


def test_isl_coalescing_failure_in_code_generation_is_retried_seed_952043():
    """Seed 952043: under these options isl's code generation failed an internal check of its
    coalescing ("original tableau does not correspond to original basic map", an isl bug)
    and the compile ended with an internal error. Code generation now retries without the
    bounded wrapping that coalescing step tries; the kernel equals Halide's realize."""
    from fuzz import halide_pipelines as H

    options = (tc.MappingOptions().tile(3, 1, 3).mapToThreads(48, 3).mapToBlocks(1, 8, 4)
               .unroll(4).useSharedMemory(True).useReadOnlyCache(True)
               .intraTileSchedulePositiveOrthant(False).useTensorCores(True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert H.check(H.case(952043), [options], schedules=()) == []


def test_strided_footprint_of_several_pieces_seed_952801():
    """Seed 952801: a thread's share of a histogram's footprint was a union of three basic
    maps with different existentials, and isl's stride detection crashed the process on it
    (a segmentation fault in its simple hull). Such a union now coalesces first and otherwise
    keeps stride 1; the kernel equals Halide's realize."""
    from fuzz import halide_pipelines as H

    options = (tc.MappingOptions().tile(1, 3, 1).mapToThreads(3, 8).mapToBlocks(8)
               .unrollCopyShared(True).useReadOnlyCache(True)
               .outerScheduleFusionStrategy("Max").scheduleSpecialize(True)
               .tileImperfectlyNested(True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert H.check(H.case(952801), [options], schedules=()) == []
