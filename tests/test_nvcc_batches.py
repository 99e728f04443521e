"""The suite's batched nvcc checks (conftest.py) find exactly the kernels nvcc rejects."""

import os
import re
import shutil

import nvcc_batches

# Two kernels as codegen writes them: the same extern "C" name, the same file-level macro.
GOOD = """#include <cstdint>
#define floord(n, d) ((n) / (d))
extern "C" __global__ void f(float* __restrict__ O, int N) {
#define S0(i) O[i] = floord(i, 2);
  if (threadIdx.x < N) S0(threadIdx.x)
#undef S0
}
"""
OTHER = GOOD.replace("floord(i, 2)", "floord(i, 3) + 1.0f").replace("((n) / (d))", "((n) >> (d))")
BAD = GOOD.replace("O[i] = floord(i, 2);", "O[i] = undefined_thing;")


def test_a_unit_keeps_same_named_kernels_and_their_macros_apart():
    unit = nvcc_batches.translation_unit([GOOD, OTHER])
    assert unit.count("#include <cstdint>") == 1 and 'extern "C"' not in unit
    assert re.findall(r"namespace (\w+)", unit) == ["tc_nvcc_unit_0", "tc_nvcc_unit_1"]
    assert unit.count("#undef floord") == 2 and '#line 1 "kernel1.cu"' in unit


def test_a_rejected_kernel_is_named_and_the_others_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no kernel known to compile yet
    rejected = nvcc_batches.check_all([GOOD, BAD], jobs=1)
    if shutil.which("nvcc") is None:  # nothing can be checked, and nothing is claimed
        assert rejected == {}
        return
    assert list(rejected) == [BAD] and "undefined_thing" in rejected[BAD]
    assert os.listdir(tmp_path / "tcstage" / "nvcc-checked") == [nvcc_batches._marker(GOOD)[-32:]]
