"""tcstage: a staged compiler for Tensor Comprehensions.

    import tcstage as tc
    prog = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(i,j) +=! A(i,k) * B(k,j) }")
    C = prog.mm(A, B)                  # runs on the CPU through Halide's JIT
    prog.mm.output_shapes((M, K), (K, N))
    k = tc.compile(src, "mm", A, B, options=tc.MappingOptions().tile(32, 32).mapToThreads(32, 8))
    C = k(A, B)                        # one CUDA kernel, launched with pycuda
    res = tc.autotune(src, "mm", A, B) # search MappingOptions (GPU, or the cost model); cached
    k = tc.compile(src, "mm", A, B, options="auto")   # the cached best
    f = tc.from_halide(halide_func)    # a Halide pipeline: f(img, output_shape=(H, W)) on the CPU,
    k = tc.compile(f, img, output_shape=(H, W), options=...)   # or one CUDA kernel
    text = tc.gradient(src, "mm")      # the backward function, as TC source (tcstage.grad)
    text = tc.jvp(src, "mm")           # the forward-mode derivative (tangents), as TC source
"""

from tcstage.errors import (TCArgumentError, TCError, TCIndexError, TCPartitionError,
                            TCRangeError, TCSemanticError, TCSyntaxError, TCWarning)
from tcstage.options import FusionStrategy, MappingOptions
from tcstage.cpu.options import CpuSchedule
from tcstage.cuda.runtime import Kernel
from tcstage.api import compile
from tcstage.program import PolymorphicFunction, Program, TCFunction, define
from tcstage.halide.pipeline import HalideFunction, from_halide
from tcstage.tune.tuner import TuneResult, autotune
from tcstage.tune.compare import compare
from tcstage.grad import gradient, jvp

__all__ = ["CpuSchedule", "define", "gradient", "jvp", "from_halide", "HalideFunction", "compile", "autotune", "compare", "TuneResult", "Kernel", "Program", "TCFunction", "PolymorphicFunction", "TCError", "TCSyntaxError", "TCSemanticError",
           "TCRangeError", "TCPartitionError", "TCArgumentError", "TCIndexError", "TCWarning", "MappingOptions", "FusionStrategy"]
__version__ = "0.1.0"
