"""tcstage: a staged compiler for Tensor Comprehensions.

    import tcstage as tc
    prog = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(i,j) +=! A(i,k) * B(k,j) }")
    C = prog.mm(A, B)                  # runs on the CPU through Halide's JIT
    prog.mm.output_shapes((M, K), (K, N))
"""

from tcstage.errors import (TCArgumentError, TCError, TCRangeError, TCSemanticError,
                            TCSyntaxError, TCWarning)
from tcstage.options import FusionStrategy, MappingOptions
from tcstage.program import Program, TCFunction, define

__all__ = ["define", "Program", "TCFunction", "TCError", "TCSyntaxError", "TCSemanticError",
           "TCRangeError", "TCArgumentError", "TCWarning", "MappingOptions", "FusionStrategy"]
__version__ = "0.1.0"
