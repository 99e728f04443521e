"""MappingOptions: the chain API, validation, the text form and its parser, the dict form."""

import builtins
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcstage.errors import TCError
from tcstage.options import FusionStrategy, MappingOptions, TCOptionsError

M = MappingOptions


# --------------------------------------------------------------------------------------------
# chain, immutability, equality
# --------------------------------------------------------------------------------------------

def test_single_thread_defaults():
    o = M()
    assert M.single_thread() == M.named("single_thread") == M("single_thread") == o.tile(1)
    assert o.tile_sizes == () and o.threads == (1,) and o.blocks == (1,)
    assert o.unroll_factor == 1
    assert not (o.use_shared_memory or o.use_private_memory or o.unroll_copy_shared)
    assert o.outer_schedule_fusion_strategy is FusionStrategy.Preserve3Coincident
    assert o.intra_tile_schedule_fusion_strategy is FusionStrategy.Preserve3Coincident
    assert o.outer_schedule_positive_orthant and not o.outer_schedule_allow_skewing
    assert o.max_shared_memory is None and o.shared_depth is None and o.private_depth is None
    assert str(o) == "MappingOptions()" == repr(o)


def test_chain_returns_new_objects():
    base = M()
    a = base.tile(32, 32)
    b = a.mapToThreads(32, 8).mapToBlocks(64, 64).unroll(4)
    assert base == M() and a == M().tile(32, 32)
    assert a is not base and b is not a
    assert b.tile_sizes == (32, 32) and b.threads == (32, 8) and b.blocks == (64, 64)
    assert b.unroll_factor == 4
    assert str(b) == ("MappingOptions().tile(32, 32).mapToThreads(32, 8).mapToBlocks(64, 64)"
                      ".unroll(4)")
    with pytest.raises(AttributeError):
        b.threads = (1,)


def test_equality_and_hash():
    a = M().tile(32, 32).useSharedMemory(True)
    b = M().useSharedMemory(True).tile([32, 32])
    assert a == b and hash(a) == hash(b)
    assert len({a, b, M(), M.single_thread()}) == 3
    assert a != a.useSharedMemory(False)
    assert M().mapToThreads(32) != M().mapToThreads(32, 1)  # kept as given, like TC


def test_sizes_forms():
    assert M().tile(32, 32, 32) == M().tile([32, 32, 32]) == M().tile((32, 32, 32))
    assert M().tile(np.int64(4), np.int32(2)).tile_sizes == (4, 2)
    assert M().mapToThreads(np.array([4, 8])).threads == (4, 8)
    assert type(M().tile(np.int64(4)).tile_sizes[0]) is int
    assert M().tile(0, 32).tile_sizes == (0, 32)  # 0: leave that loop untiled
    assert M().useSharedMemory(np.True_).use_shared_memory is True


def test_every_option_sets_its_attribute():
    o = (M().unrollCopyShared(True).unrollGpuTile(True).usePrivateMemory(True)
         .maxSharedMemory(49152).sharedDepth(2).privateDepth(3).useReadOnlyCache(True)
         .outerScheduleAllowSkewing(True).outerSchedulePositiveOrthant(False)
         .intraTileScheduleAllowSkewing(True).intraTileSchedulePositiveOrthant(False)
         .scheduleSpecialize(True).fixParametersBeforeScheduling(True)
         .tileImperfectlyNested(True).matchLibraryCalls(True).useRegisterTiling(True))
    assert o.use_register_tiling and o.unroll_copy_shared and o.unroll_gpu_tile and o.use_private_memory
    assert (o.max_shared_memory, o.shared_depth, o.private_depth) == (49152, 2, 3)
    assert o.use_read_only_cache and o.outer_schedule_allow_skewing
    assert not o.outer_schedule_positive_orthant and not o.intra_tile_schedule_positive_orthant
    assert o.intra_tile_schedule_allow_skewing and o.schedule_specialize
    assert o.fix_parameters_before_scheduling and o.tile_imperfectly_nested
    assert o.match_library_calls
    assert M.parse(str(o)) == o


def test_fusion_strategies():
    o = M().scheduleFusionStrategy("max")
    assert o.outer_schedule_fusion_strategy is FusionStrategy.Max
    assert o.intra_tile_schedule_fusion_strategy is FusionStrategy.Max
    assert str(o) == 'MappingOptions().scheduleFusionStrategy("Max")'
    o = M().outerScheduleFusionStrategy(FusionStrategy.Min).intraTileScheduleFusionStrategy(
        "preserve3coincident")
    assert o.outer_schedule_fusion_strategy is FusionStrategy.Min
    assert str(o) == 'MappingOptions().outerScheduleFusionStrategy("Min")'
    assert M().scheduleFusionStrategy("MIN") == M().scheduleFusionStrategy(FusionStrategy.Min)


def test_derived_views():
    o = M().mapToThreads(32, 8).mapToBlocks(64)
    assert o.block_dim == (32, 8, 1) and o.grid_dim == (64, 1, 1)
    assert o.num_threads == 256 and o.num_blocks == 64


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------

BAD_CALLS = [
    (lambda: M().tile(-1), "tile", "-1", ">= 0"),
    (lambda: M().tile(), "tile", "at least one", ">= 0"),
    (lambda: M().tile(32.0), "tile", "32.0", "integer"),
    (lambda: M().tile(True), "tile", "True", "integer"),
    (lambda: M().tile("32"), "tile", "'32'", "integer"),
    (lambda: M().mapToThreads(0), "mapToThreads", "x=0", "1 to 1024"),
    (lambda: M().mapToThreads(2048), "mapToThreads", "x=2048", "1 to 1024"),
    (lambda: M().mapToThreads(1, 2000), "mapToThreads", "y=2000", "1 to 1024"),
    (lambda: M().mapToThreads(1, 1, 65), "mapToThreads", "z=65", "1 to 64"),
    (lambda: M().mapToThreads(64, 32), "mapToThreads", "2048", "at most 1024"),
    (lambda: M().mapToThreads(1, 2, 3, 4), "mapToThreads", "(1, 2, 3, 4)", "1 to 3"),
    (lambda: M().mapToThreads(), "mapToThreads", "got 0", "1 to 3"),
    (lambda: M().mapToBlocks(0), "mapToBlocks", "x=0", "1 to 2147483647"),
    (lambda: M().mapToBlocks(2**31), "mapToBlocks", "x=2147483648", "1 to 2147483647"),
    (lambda: M().mapToBlocks(1, 65536), "mapToBlocks", "y=65536", "1 to 65535"),
    (lambda: M().mapToBlocks(1, 1, 70000), "mapToBlocks", "z=70000", "1 to 65535"),
    (lambda: M().unroll(0), "unroll", "0", ">= 1"),
    (lambda: M().unroll(2.5), "unroll", "2.5", "integer"),
    (lambda: M().useSharedMemory(1), "useSharedMemory", "1 (int)", "True or False"),
    (lambda: M().usePrivateMemory("true"), "usePrivateMemory", "'true'", "True or False"),
    (lambda: M().unrollCopyShared(0), "unrollCopyShared", "0", "True or False"),
    (lambda: M().unrollGpuTile(None), "unrollGpuTile", "None", "True or False"),
    (lambda: M().useReadOnlyCache(1), "useReadOnlyCache", "1", "True or False"),
    (lambda: M().useRegisterTiling("yes"), "useRegisterTiling", "'yes'", "True or False"),
    (lambda: M().matchLibraryCalls("yes"), "matchLibraryCalls", "'yes'", "True or False"),
    (lambda: M().fixParametersBeforeScheduling(1), "fixParametersBeforeScheduling", "1",
     "True or False"),
    (lambda: M().tileImperfectlyNested(0), "tileImperfectlyNested", "0", "True or False"),
    (lambda: M().outerScheduleAllowSkewing(1), "outerScheduleAllowSkewing", "1",
     "True or False"),
    (lambda: M().outerSchedulePositiveOrthant(1), "outerSchedulePositiveOrthant", "1",
     "True or False"),
    (lambda: M().scheduleSpecialize("false"), "scheduleSpecialize", "'false'", "True or False"),
    (lambda: M().maxSharedMemory(-1), "maxSharedMemory", "-1", ">= 0"),
    (lambda: M().maxSharedMemory(None), "maxSharedMemory", "None", "integer"),
    (lambda: M().privateDepth(-2), "privateDepth", "-2", ">= 0"),
    (lambda: M().sharedDepth(1.0), "sharedDepth", "1.0", "integer"),
    (lambda: M().scheduleFusionStrategy("fast"), "scheduleFusionStrategy", "'fast'",
     "Max, Preserve3Coincident, Min"),
    (lambda: M().outerScheduleFusionStrategy(1), "outerScheduleFusionStrategy", "1",
     "Max, Preserve3Coincident, Min"),
    (lambda: M().intraTileScheduleFusionStrategy("maxx"), "intraTileScheduleFusionStrategy",
     "'maxx'", "Max, Preserve3Coincident, Min"),
    (lambda: M(threads=(4096,)), "mapToThreads", "4096", "1 to 1024"),
]


@pytest.mark.parametrize("call, option, value, allowed", BAD_CALLS)
def test_validation_errors(call, option, value, allowed):
    with pytest.raises(TCOptionsError) as info:
        call()
    message = info.value.message
    assert isinstance(info.value, TCError)
    assert info.value.option == option
    assert message.startswith(option + ":")
    assert value in message and allowed in message, message


def test_named_presets():
    for name in ("single_thread", "naive", "pointwise", "mlp", "conv", "group_conv",
                 "reduction"):
        preset = M.named(name)
        assert preset == getattr(M, name)() == M.named(name.upper()) == M(name)
        assert M.parse(str(preset)) == preset
    # TC's own starting points (tc/core/cuda/cuda_mapping_options.cc), by both spellings
    tc_starts = {
        "Naive": "tile(32, 32, 32).mapToThreads(32, 8).mapToBlocks(256, 256)",
        "SingleThread": "tile(1)",
        "Pointwise": "tile(32, 32, 32).mapToThreads(32, 4, 4).mapToBlocks(100, 100, 100)"
                     ".unroll(128)",
        "Mlp": 'tile(1).mapToThreads(128).mapToBlocks(128).outerScheduleFusionStrategy("Max")',
        "Convolution": "tile(4, 8, 8, 8).mapToThreads(4, 16, 4).mapToBlocks(256, 256, 256)",
        "GroupConvolution": "tile(1, 1).mapToThreads(4, 16, 4).mapToBlocks(256, 256)",
    }
    for start, chain in tc_starts.items():
        expected = "MappingOptions()" + ("." + chain if chain else "")
        assert str(M.parse(f"tc::CudaMappingOptions::make{start}MappingOptions()")) == expected
        assert str(M(start)) == expected
    assert M.named("group-conv") == M.group_conv()
    with pytest.raises(TCOptionsError, match=r"'mpl' \(did you mean 'mlp'\?\); allowed: "
                                             r"single_thread, naive, pointwise, mlp, conv, "
                                             r"group_conv, reduction"):
        M.named("mpl")


# --------------------------------------------------------------------------------------------
# text: the paper's appendix listings (A.4), symbolic sizes replaced by numbers
# --------------------------------------------------------------------------------------------

PAPER = {
    "tmm baseline": """
tc::IslKernelOptions::makeDefaultMappingOptions()
     .scheduleSpecialize(true)
     .tile({32, 32, 32})
     .mapToThreads({32, 32})
     .mapToBlocks({4, 8})
     .useSharedMemory(true)
     .usePrivateMemory(true)
     .unrollCopyShared(true)
     .unroll(256);""",
    "tmm autotuned": """
tc::IslKernelOptions::makeDefaultMappingOptions()
     .scheduleSpecialize(false)
     .tile({4, 32})
     .mapToThreads({1, 32})
     .mapToBlocks({64, 128})
     .useSharedMemory(true)
     .usePrivateMemory(true)
     .unrollCopyShared(false)
     .unroll(4);""",
    "tbmm baseline": """
tc::IslKernelOptions::makeDefaultMappingOptions()
     .tile({1})
     .mapToThreads({128})
     .mapToBlocks({500})
     .useSharedMemory(true)
     .usePrivateMemory(true)
     .unrollCopyShared(false)
     .unroll(1024);""",
    "tbmm autotuned": """
tc::IslKernelOptions::makeDefaultMappingOptions()
     .scheduleSpecialize(true)
     .tile({1})
     .mapToThreads({7, 26})
     .mapToBlocks({72, 16, 1})
     .useSharedMemory(true)
     .usePrivateMemory(true)
     .unrollCopyShared(true)
     .unroll(128);""",
    "gconv baseline": """
auto options = tc::IslKernelOptions::makeDefaultMappingOptions()
     .tile({1, 1, 1})
     .mapToThreads({4, 8, 4})
     .mapToBlocks({32, 32})
     .useSharedMemory(true)
     .usePrivateMemory(false)
     .unrollCopyShared(true)
     .unroll(1);""",
    "gconv autotuned": """
auto options = tc::IslKernelOptions::makeDefaultMappingOptions()
     .tile({1, 1})
     .mapToThreads({8, 7, 7})
     .mapToBlocks({32, 32, 3})
     .useSharedMemory(true)
     .usePrivateMemory(false)
     .unrollCopyShared(true)
     .unroll(256);""",
    "2LUT": """
tc::IslKernelOptions::makeDefaultMappingOptions()
   .tile({4, 32})
   .mapToThreads({1, 32})
   .mapToBlocks({100, 100})
   .useSharedMemory(true)
   .usePrivateMemory(true)
   .unrollCopyShared(true)
   .unrollGpuTile(true)
   .unroll(1024)""",
    "C3": """
 auto options = tc::IslKernelOptions::makeDefaultMappingOptions()
     .scheduleSpecialize(true)
     .tile({32, 32, 32})
     .mapToThreads({4, 32})
     .mapToBlocks({128, 128})
     .useSharedMemory(true)
     .usePrivateMemory(true)
     .unrollCopyShared(true)
     .unroll(128);""",
    "MLP1": """
 auto options = tc::IslKernelOptions::makeDefaultMappingOptions()
     .scheduleSpecialize(true)
     .tile({16, 16, 128})
     .mapToThreads({16, 16})
     .mapToBlocks({32, 32})
     .useSharedMemory(true)
     .usePrivateMemory(true)
     .unrollCopyShared(false)
     .unroll(1);""",
    "MLP3": """
IslKernelOptions options = makeDefaultMappingOptions()
    .set_fusion_strategy(FusionStrategy::Max)
    .tile({1})
    .mapToThreads({128})
    .mapToBlocks({128});""",
}

PAPER_EXPECTED = {
    "tmm baseline": M().scheduleSpecialize(True).tile(32, 32, 32).mapToThreads(32, 32)
    .mapToBlocks(4, 8).useSharedMemory(True).usePrivateMemory(True).unrollCopyShared(True)
    .unroll(256),
    "tmm autotuned": M().tile(4, 32).mapToThreads(1, 32).mapToBlocks(64, 128)
    .useSharedMemory(True).usePrivateMemory(True).unroll(4),
    "tbmm baseline": M().tile(1).mapToThreads(128).mapToBlocks(500).useSharedMemory(True)
    .usePrivateMemory(True).unroll(1024),
    "tbmm autotuned": M().scheduleSpecialize(True).tile(1).mapToThreads(7, 26)
    .mapToBlocks(72, 16, 1).useSharedMemory(True).usePrivateMemory(True)
    .unrollCopyShared(True).unroll(128),
    "gconv baseline": M().tile(1, 1, 1).mapToThreads(4, 8, 4).mapToBlocks(32, 32)
    .useSharedMemory(True).unrollCopyShared(True),
    "gconv autotuned": M().tile(1, 1).mapToThreads(8, 7, 7).mapToBlocks(32, 32, 3)
    .useSharedMemory(True).unrollCopyShared(True).unroll(256),
    "2LUT": M().tile(4, 32).mapToThreads(1, 32).mapToBlocks(100, 100).useSharedMemory(True)
    .usePrivateMemory(True).unrollCopyShared(True).unrollGpuTile(True).unroll(1024),
    "C3": M().scheduleSpecialize(True).tile(32, 32, 32).mapToThreads(4, 32)
    .mapToBlocks(128, 128).useSharedMemory(True).usePrivateMemory(True)
    .unrollCopyShared(True).unroll(128),
    "MLP1": M().scheduleSpecialize(True).tile(16, 16, 128).mapToThreads(16, 16)
    .mapToBlocks(32, 32).useSharedMemory(True).usePrivateMemory(True),
    "MLP3": M().scheduleFusionStrategy(FusionStrategy.Max).tile(1).mapToThreads(128)
    .mapToBlocks(128),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_listings(name):
    o = M.parse(PAPER[name])
    assert o == PAPER_EXPECTED[name]
    assert M.parse(str(o)) == o


def test_paper_symbolic_sizes_are_rejected_with_a_hint():
    with pytest.raises(TCOptionsError) as info:
        M.parse(".mapToBlocks({M / 32, N / 32})")
    assert info.value.column == 17 and "'/'" in info.value.message
    assert "not evaluated" in str(info.value)


@pytest.mark.parametrize("text, expected", [
    ("MappingOptions()", M()),
    ("tc.MappingOptions().tile(4)", M().tile(4)),
    ("tcstage.MappingOptions().tile(4);", M().tile(4)),
    ("tc::MappingOptions().unroll(2)", M().unroll(2)),
    (".tile(4).unroll(2)", M().tile(4).unroll(2)),
    ("tile(4).unroll(2)", M().tile(4).unroll(2)),
    ("makeDefaultMappingOptions()", M()),
    ("tc::CudaMappingOptions::makeMlpMappingOptions().unroll(2)", M.mlp().unroll(2)),
    ("MappingOptions.mlp().unroll(2)", M.mlp().unroll(2)),
    ("tc.MappingOptions.named('group_conv')", M.group_conv()),
    ('MappingOptions("pointwise")', M.pointwise()),
    ("opts = MappingOptions().useSharedMemory(True)", M().useSharedMemory(True)),
    ("MappingOptions()\n  .tile([32, 32])  // rows, columns\n  .useSharedMemory(false)\n",
     M().tile(32, 32)),
    ("MappingOptions().mapToThreads( 32 ,\t8 )", M().mapToThreads(32, 8)),
    ("MappingOptions().scheduleFusionStrategy(tc::FusionStrategy::Min)",
     M().scheduleFusionStrategy("Min")),
    ("MappingOptions().scheduleFusionStrategy(FusionStrategy.Max)",
     M().scheduleFusionStrategy("Max")),
    ("MappingOptions().outerScheduleFusionStrategy(max)",
     M().outerScheduleFusionStrategy("Max")),
    ("MappingOptions().outerScheduleFusionStrategy('preserve3coincident')", M()),
    ("MappingOptions().tile(32, 32).tile(8)", M().tile(8)),  # the last call wins
])
def test_parse_accepted_forms(text, expected):
    assert M.parse(text) == expected


@pytest.mark.parametrize("text, message, column", [
    ("MappingOptions().mapToThread(32)", "unknown option 'mapToThread' (did you mean "
     "'mapToThreads'", 18),
    ("MappingOptions().useSharedMem(true)", "did you mean 'useSharedMemory'", 18),
    ("MappingOptions().tile(32, 32", "expected ',' or ')', found end of input", 29),
    ("MappingOptions().tile(32, 32.unroll(2)", "expected ',' or ')', found '.'", 29),
    ("MappingOptions().tile({32, 32)", "expected ',' or '}', found ')'", 30),
    ("MappingOptions().tile(32) x", "expected '.option(...)' or end of input, found 'x'", 27),
    ("MappingOptions().tile 32", "expected '(' after 'tile', found '32'", 23),
    ("MappingOptions().tile(32x)", "malformed number '32x'", 23),
    ("MappingOptions().tile(32 @ 2)", "unexpected character '@'", 26),
    ("MappingOptions().scheduleFusionStrategy(\"max)", "unterminated string", 41),
    ("MappingOptions().unroll(M)", "unexpected name 'M'", 25),
    ("MappingOptions().unroll()", "'unroll' takes exactly one argument, got 0", 18),
    ("MappingOptions().unroll(2, 3)", "'unroll' takes exactly one argument, got 2", 18),
    ("MappingOptions().mapToThreads(32, 2000)", "mapToThreads: thread size y=2000", 35),
    ("MappingOptions().mapToThreads({64, 32})", "2048 threads per block", 31),
    ("MappingOptions().useSharedMemory(1)", "useSharedMemory: expected True or False, got 1",
     34),
    ("MappingOptions().tile({{1}})", "nested lists are not option values", 24),
    ("MappingOptions()..tile(1)", "expected an option name after '.'", 18),
    ("MappingOptions.mpl()", "unknown starting point 'mpl' (did you mean 'mlp'", 16),
    ("MappingOptions('fast')", "unknown named mapping options 'fast'", 16),
    ("np.MappingOptions()", "unexpected qualifier 'np'", 1),
    ("__import__('os').system('true')", "unknown starting point '__import__'", 1),
    ("", "expected mapping options such as 'MappingOptions()', found end of input", 1),
    ("MappingOptions().tile(1)\n   .unroll(0)", "unroll: unroll factor 0 is too small", 12),
])
def test_parse_errors(text, message, column):
    with pytest.raises(TCOptionsError) as info:
        M.parse(text)
    assert message in info.value.message, info.value.message
    assert info.value.column == column, str(info.value)
    assert f":{column}: error:" in str(info.value)


def test_parse_error_lists_known_options_and_renders_a_caret():
    with pytest.raises(TCOptionsError) as info:
        M.parse("MappingOptions().tile(32)\n  .unrol(4)")
    text = str(info.value)
    assert "<mapping options>:2:4: error: unknown option 'unrol' (did you mean 'unroll'" in text
    assert "    .unrol(4)\n     ^~~~~" in text
    assert "known options:" in text and "mapToBlocks" in text


def test_parse_never_evaluates(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("parse must not evaluate text")
    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    monkeypatch.setattr(builtins, "compile", forbidden)
    assert M.parse(str(M.conv())) == M.conv()
    with pytest.raises(TCOptionsError):
        M.parse("MappingOptions().tile(__import__('os').getpid())")


def test_parse_rejects_non_text():
    with pytest.raises(TCOptionsError, match="expects a string"):
        M.parse(b"MappingOptions()")


# --------------------------------------------------------------------------------------------
# dict form
# --------------------------------------------------------------------------------------------

def test_to_dict_is_plain_json():
    d = M.mlp().maxSharedMemory(1024).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["tile_sizes"] == [1] and d["threads"] == [128]
    assert d["outer_schedule_fusion_strategy"] == "Max" and d["max_shared_memory"] == 1024
    assert M.from_dict(d) == M.mlp().maxSharedMemory(1024)
    assert M.from_dict({}) == M() and M.from_dict({"threads": [8, 4]}) == M().mapToThreads(8, 4)


@pytest.mark.parametrize("data, message", [
    ({"thread": [1]}, "from_dict: unknown field 'thread' (did you mean 'threads'?); allowed: "),
    ({"threads": [0]}, "from_dict: field 'threads': mapToThreads: thread size x=0"),
    ({"threads": "32"}, "from_dict: field 'threads': mapToThreads: thread size must be an "
                        "integer, got '32'"),
    ({"use_shared_memory": 1}, "from_dict: field 'use_shared_memory': useSharedMemory: "
                               "expected True or False, got 1"),
    ({"unroll_factor": None}, "from_dict: field 'unroll_factor': unroll:"),
    ({"outer_schedule_fusion_strategy": "fast"},
     "from_dict: field 'outer_schedule_fusion_strategy': outerScheduleFusionStrategy: unknown "
     "fusion strategy 'fast'; allowed: Max, Preserve3Coincident, Min"),
    ({"max_shared_memory": -5}, "from_dict: field 'max_shared_memory': maxSharedMemory:"),
    ([("threads", [1])], "from_dict expects a mapping, got"),
])
def test_from_dict_errors(data, message):
    with pytest.raises(TCOptionsError) as info:
        M.from_dict(data)
    assert message in info.value.message, info.value.message


# --------------------------------------------------------------------------------------------
# property tests: random valid chains round-trip through text and dicts
# --------------------------------------------------------------------------------------------

@st.composite
def _sizes_args(draw, sizes):
    """Sizes as separate arguments or as one list/tuple."""
    form = draw(st.sampled_from(["args", "list", "tuple"]))
    return tuple(sizes) if form == "args" else (list(sizes),) if form == "list" else (tuple(sizes),)


@st.composite
def _threads(draw):
    x = draw(st.integers(1, 1024))
    dims = [x]
    if draw(st.booleans()):
        dims.append(draw(st.integers(1, 1024 // x)))
        if draw(st.booleans()):
            dims.append(draw(st.integers(1, min(64, 1024 // (x * dims[1])))))
    return dims


_blocks = st.lists(st.integers(1, 65535), min_size=0, max_size=2).flatmap(
    lambda yz: st.integers(1, 2**31 - 1).map(lambda x: [x, *yz]))

_fusion = st.sampled_from(list(FusionStrategy)) | st.sampled_from(
    ["max", "MAX", "Min", "min", "preserve3coincident", "Preserve3Coincident"])

_BOOL_METHODS = ["unrollCopyShared", "unrollGpuTile", "useSharedMemory", "usePrivateMemory",
                 "useReadOnlyCache", "outerScheduleAllowSkewing", "outerSchedulePositiveOrthant",
                 "intraTileScheduleAllowSkewing", "intraTileSchedulePositiveOrthant",
                 "scheduleSpecialize", "fixParametersBeforeScheduling", "tileImperfectlyNested",
                 "matchLibraryCalls", "useRegisterTiling"]

_call = st.one_of(
    st.lists(st.integers(0, 4096), min_size=1, max_size=6).flatmap(_sizes_args)
    .map(lambda a: ("tile", a)),
    _threads().flatmap(_sizes_args).map(lambda a: ("mapToThreads", a)),
    _blocks.flatmap(_sizes_args).map(lambda a: ("mapToBlocks", a)),
    st.integers(1, 2**20).map(lambda n: ("unroll", (n,))),
    st.tuples(st.sampled_from(["maxSharedMemory", "sharedDepth", "privateDepth"]),
              st.integers(0, 2**20).map(lambda n: (n,))),
    st.tuples(st.sampled_from(_BOOL_METHODS), st.booleans().map(lambda b: (b,))),
    st.tuples(st.sampled_from(["scheduleFusionStrategy", "outerScheduleFusionStrategy",
                               "intraTileScheduleFusionStrategy"]), _fusion.map(lambda f: (f,))),
)

_preset = st.sampled_from(["naive", "pointwise", "mlp", "conv", "group_conv", "reduction"])


@st.composite
def random_options(draw):
    options = M.named(draw(_preset))
    for method, args in draw(st.lists(_call, max_size=12)):
        options = getattr(options, method)(*args)
    return options


@settings(max_examples=150, deadline=None)
@given(random_options())
def test_text_round_trip(o):
    text = str(o)
    back = M.parse(text)
    assert back == o and hash(back) == hash(o)
    assert str(back) == text
    # the same text reformatted in the paper's C++ style
    cpp = ("tc::IslKernelOptions::makeDefaultMappingOptions()\n    "
           + text.removeprefix("MappingOptions()").replace(").", ")\n    .")
           .replace("True", "true").replace("False", "false") + ";")
    assert M.parse(cpp) == o


@settings(max_examples=150, deadline=None)
@given(random_options())
def test_dict_round_trip(o):
    d = o.to_dict()
    assert M.from_dict(json.loads(json.dumps(d))) == o
    assert M.from_dict(d).to_dict() == d


@pytest.mark.parametrize("digits", [20, 5000])
def test_an_integer_too_long_to_be_an_option_is_an_error_at_its_place(digits):
    """Python refuses to read an integer of more than 4,300 digits (a raw ValueError leaked
    from both parsers); every option value fits in 19 digits."""
    from tcstage.cpu.options import CpuSchedule
    big = "9" * digits
    with pytest.raises(TCOptionsError, match=f"an integer of {digits} digits is out of range") \
            as e:
        MappingOptions.parse(f"MappingOptions().tile(4, {big})")
    assert "^" in str(e.value)
    with pytest.raises(TCError, match=f"an integer of {digits} digits is out of range"):
        CpuSchedule.parse(f"CpuSchedule().registerTile({big}, 2)")
