"""TC functions as PyTorch operators, with autograd through backward TCs.

    import tcstage.torch as tct
    layer = tct.op(source_or_program, "mlp1")   # a torch.library custom op, namespace tcstage
    y = layer(x, w, b)                          # CPU or CUDA tensors in, tensors out
    y.sum().backward()                          # through the backward TC

Needs PyTorch (`pip install 'tcstage[torch]'`); `import tcstage` alone never imports it.
See docs/torch.md.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as _e:  # pragma: no cover - depends on the installation
    raise ImportError("tcstage.torch needs PyTorch: pip install 'tcstage[torch]' "
                      f"({_e})") from None

from tcstage.halide import aot as _aot
from tcstage.torch.backward import backward_from_text, check_backward
from tcstage.torch.ops import NAMESPACE, TCOp, op
from tcstage.torch.shapes import evaluate_symbolic

_aot.share_torch_threads()  # (kernels loaded before PyTorch: see tcstage/halide/pool.c)

__all__ = ["op", "TCOp", "NAMESPACE", "backward_from_text", "check_backward", "evaluate_symbolic"]
