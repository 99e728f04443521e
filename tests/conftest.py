"""Every CUDA kernel the test suite generates is also compiled by nvcc where nvcc is on the PATH
(it is on the development machine and in CI), so that a syntax or type error in generated CUDA
fails the run even when a test only runs the kernel under emulation.

The kernels a test process generates are collected and compiled when its last test ends, many
to one nvcc call (nvcc_batches.py: one at a time cost most of the suite's time); a kernel nvcc
rejects is reported as an error of that last test, naming the tests that generated it.
"""

import os

import pytest

from tcstage.cuda import emulate, runtime
from tcstage.halide import aot

import nvcc_batches  # tests/
import real_gpu  # tests/


# --real-gpu (or TCSTAGE_REAL_GPU=1): every emulated launch also runs on the GPU and is compared
# (tests/real_gpu.py); without a GPU every test is skipped with the reason, so that a run meant
# to check kernels on a GPU never passes without having used one.

def pytest_addoption(parser):
    parser.addoption(real_gpu.OPTION, action="store_true", dest="real_gpu",
                     help="also launch every emulated kernel on the GPU through pycuda and "
                          "compare it with the emulator (the same as TCSTAGE_REAL_GPU=1)")


_REAL_GPU = real_gpu.Session()


def pytest_configure(config):
    if real_gpu.requested(config):
        _REAL_GPU.start()


def pytest_unconfigure(config):
    _REAL_GPU.stop()


# The README's test command must stay under about 5 minutes on a 2-core machine. These tests
# (measured by `pytest --durations=0`: a second or more each there) run in the slow step
# instead (`pytest -m slow`, in .ci/run). A parametrized test keeps its first cases in the
# quick run (the number given), so that every path it checks is still checked there.
SLOW = {
    "test_promotion.py::test_paper_kernels_with_promotion_match_numpy": 12,
    "test_promotion.py::test_paper_kernels_with_register_tiling_match_numpy": 4,
    "test_promotion.py::test_random_memory_options": 0,
    "test_tune.py::test_search_with_the_model_converges_far_below_the_naive_kernel": 0,
    "test_tune.py::test_compile_returns_the_same_kernel_for_the_same_call": 0,
    "test_tune.py::test_the_tuned_kernel_computes_the_right_result": 0,
    "test_tune.py::test_new_best_is_cached_and_options_auto_uses_it": 0,
    "test_tune.py::test_crashing_hanging_and_wrong_candidates_get_their_status_and_never_win": 0,
    "test_tune_model.py::test_copy_of_a_clamped_read_in_pieces_stays_bounded": 0,
    "test_tune_model.py::test_predict_is_fast_on_the_papers_kernels": 0,
    "test_tune_cli.py::test_compare_plot_has_the_tuning_curve": 0,
    "test_cuda_spec.py::test_spec_tc_as_mapped_cuda": 15,
    "test_cuda_mapping.py::test_mapped_kernel_matches_numpy_and_halide": 12,
    "test_cuda_mapping.py::test_random_options": 0,
    "test_halide_ports.py::test_port": 0,
    "test_halide_apps.py::test_algorithm_matches_reference": 3,
    # (the apps ported for issue 27, after the first nine, in the slow step)
    "test_halide_apps.py::test_manual_gpu_schedule_lowers_for_cuda": 9,
    "test_halide_apps.py::test_manual_cpu_schedule_matches_reference": 3,
    "test_halide_pipelines.py::test_halide_intrinsics": 0,
    "test_halide_pipelines.py::test_inline_reductions_scalar_outputs_wrappers_bools_and_half": 0,
    "test_halide_pipelines.py::test_autotune_a_pipeline_and_compile_auto": 0,
    "test_halide_pipelines.py::test_boundary_conditions": 0,
    "test_halide_compare.py::test_compare_pipeline_with_your_schedule_as_baseline": 0,
    "test_halide_compare.py::test_cli_compare_module": 1,
    "test_torch_gradcheck.py::test_gradcheck": 4,
    "test_torch_op.py::test_gradcheck_float64_with_the_generated_backward": 2,
    "test_tc_corpus.py::test_values": 6,
    "test_grad.py::test_backward_runs_as_one_cuda_kernel": 1,
    "test_grad.py::test_paper_kernels": 4,
    "test_grad.py::test_layers": 4,
    "test_grad_fuzz.py::test_gradient_matches_central_differences": 0,
    "test_tensor_cores.py::test_tmm": 6,
    "test_tensor_cores.py::test_kronecker_convolution_and_transposed_operands": 1,
    "test_parallel_reductions.py::test_row_statistics_under_promotion_and_fusion": 4,
    "test_parallel_reductions.py::test_every_operator_for_float_half_and_bfloat16": 4,
    "test_differential.py::test_scatter_programs_match_reference": 3,
    "test_hardening_time.py::test_programs_longer_than_a_chunk_compute_the_reference": 0,
    "test_hardening_cuda.py::test_functions_named_like_cpp_or_cuda_compile": 4,
    "test_any_rank.py::test_layers_as_emulated_cuda_at_several_ranks": 4,
    "test_emulation_warp.py::test_mixed_bf16_expressions_are_as_ambiguous_as_in_cuda": 0,
    "test_cuda_naive.py::test_every_scalar_type_compiles_and_computes": 4,
    "test_padding.py::test_padded_convolutions_under_cuda_emulation": 2,
    "test_casts.py::test_float_to_integer_truncates_saturates_and_sends_nan_to_zero": 8,
    "test_halide_pipelines.py::test_multi_stage_pipeline_with_reduction_and_pointwise": 0,
    "test_any_rank.py::test_layers_on_the_cpu_at_every_rank": 6,
    "test_any_rank_fuzz.py::test_lifted_programs_emulated": 1,
    "test_cpu_row_reductions.py::test_row_reductions_equal_numpy": 10,
    "test_nan.py::test_reductions_skip_nan_wherever_it_sits": 4,
    "test_emulation_warp.py::test_shuffles_of_every_type": 3,
    "test_tensor_cores.py::test_tbmm": 1,
    "test_tensor_cores.py::test_mlp1_with_bias_and_relu": 1,
    "test_tensor_cores.py::test_ptx_has_mma_sync": 1,
    "test_paper_kernels.py::test_default_schedule": 4,
    "test_hardening_time.py::test_emulator_compiler_past_its_time_limit_is_a_clear_error": 0,
    "test_train_example.py::test_training_loss_falls_and_compiling_stops": 0,
    "test_tune_cli.py::test_untranslatable_tc_uses_the_halide_cpu_baseline": 0,
    "test_cpu_tune.py::test_the_best_schedule_is_measured_checked_and_usable": 0,
    "test_overlapped_tiles.py::test_halide_apps_match_their_references": 4,
    "test_halide_fuzz_regressions.py::test_strided_footprint_of_several_pieces_seed_952801": 0,
    # (7-28 s each on an AMD EPYC, where the quick run took 10.6 min cold)
    "test_grad_fuzz.py::test_the_sample_checks_gradients": 0,
    "test_cli.py::test_run_every_example": 0,
    "test_cpu_pool.py::test_kernels_on_pytorchs_team_use_as_many_threads_as_pytorch_would": 0,
    "test_halide_fuzz_regressions.py::"
    "test_product_update_over_an_rdom_variable_the_body_does_not_use": 0,
}


def _mark_slow(items) -> None:
    seen: dict[str, int] = {}
    for item in items:
        base = item.nodeid.split("[")[0].removeprefix("tests/")
        keep = SLOW.get(base)
        if keep is None:
            continue
        seen[base] = seen.get(base, 0) + 1
        if seen[base] > keep:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)  # (before -m selects by the marks)
def pytest_collection_modifyitems(config, items):
    _mark_slow(items)
    if _REAL_GPU.problem:
        skip = pytest.mark.skip(reason=f"{real_gpu.OPTION} needs a GPU: {_REAL_GPU.problem}")
        for item in items:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        _REAL_GPU.tally.add_from(report.user_properties)


def pytest_terminal_summary(terminalreporter):
    for line in _REAL_GPU.summary():
        terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _real_gpu_share(request):
    """Each test's compared and uncompared launches go into its report, which xdist carries to
    the controller, whose summary adds them up."""
    yield
    if _REAL_GPU.twin is not None:
        request.node.user_properties.append(("real_gpu", _REAL_GPU.twin.take()))


@pytest.fixture(scope="session")
def _generated_kernels():
    kernels: dict[str, list[str]] = {}  # CUDA source -> ids of the tests that generated it
    yield kernels
    rejected = nvcc_batches.check_all(list(kernels))
    if rejected:
        pytest.fail("\n\n".join(
            f"nvcc rejects the kernel generated by {', '.join(dict.fromkeys(kernels[s]))}:\n"
            f"{message}\n--- the kernel ---\n{s}" for s, message in rejected.items()),
            pytrace=False)


@pytest.fixture(autouse=True)
def _nvcc_checks_every_kernel(monkeypatch, request, _generated_kernels):
    original = runtime.Kernel.__init__

    def recorded(self, compiled, target):
        original(self, compiled, target)
        _generated_kernels.setdefault(compiled.cuda.source, []).append(request.node.nodeid)

    monkeypatch.setattr(runtime.Kernel, "__init__", recorded)


# The emulator's kernel cache as the session found it: tests share it, whatever tuning cache
# they point TCSTAGE_CACHE_DIR at (each compiling every kernel afresh would take the suite
# many times as long). tests/test_emulation.py tests the real `cache_dir` (`.original`).
_SHARED_EMULATOR_CACHE = emulate.cache_dir()
# The same for compiled CPU pipelines (tcstage/halide/aot.py): each test's own cache would
# rebuild the Halide runtime library (about a second) and every kernel. Their keys hold the
# function, its schedule and a digest of tcstage's code, so sharing cannot mix kernels up;
# tests/test_cpu_cache.py tests a cache of its own.
_SHARED_CPU_CACHE = aot.CACHE.path()


def _shared_emulator_cache() -> str:
    return _SHARED_EMULATOR_CACHE


_shared_emulator_cache.original = emulate.cache_dir


@pytest.fixture(autouse=True)
def _private_tuning_cache(monkeypatch, tmp_path_factory):
    """Tests never read or write the user's tuning cache (options="auto", tc.autotune); the
    emulator's kernels, which live beside it, come from the session's shared cache."""
    own = tmp_path_factory.mktemp("tcstage-cache")
    os.makedirs(_SHARED_EMULATOR_CACHE, exist_ok=True)  # (subprocesses find it through emu/)
    (own / "emu").symlink_to(_SHARED_EMULATOR_CACHE, target_is_directory=True)
    os.makedirs(_SHARED_CPU_CACHE, exist_ok=True)
    (own / "cpu").symlink_to(_SHARED_CPU_CACHE, target_is_directory=True)
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(own))
    monkeypatch.setattr(emulate, "cache_dir", _shared_emulator_cache)


@pytest.fixture(autouse=True)
def _fresh_kernel_cache():
    """Each test compiles afresh: tests patch compiler stages, budgets and pycuda underneath
    tc.compile, which its in-process cache of kernels would otherwise hide."""
    from tcstage.api import clear_kernel_cache
    clear_kernel_cache()
