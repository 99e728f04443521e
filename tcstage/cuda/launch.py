"""Launching generated kernels on a GPU with pycuda (optional: `pip install 'tcstage[cuda]'`).

Arrays: numpy inputs are copied to the device and the outputs copied back; device arrays (anything
with `__cuda_array_interface__`: PyTorch CUDA tensors, CuPy arrays, pycuda GPUArrays) are used in
place and the outputs are allocated in the same framework. pycuda works in the device's primary
context, the one PyTorch and CuPy use, so their pointers are valid in our launches; every driver
call here makes it current on the calling thread first, where no context is (a CUDA context is
current per thread, and pycuda makes it current only on the thread that imported it).
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from tcstage.cuda.codegen import CudaKernel
from tcstage.errors import TCArgumentError, TCError

# numpy dtype -> struct code of pycuda's prepared calls (a bfloat16 scalar travels as its bits)
_STRUCT = {"int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
           "int64": "q", "uint64": "Q", "float16": "H", "float32": "f", "float64": "d",
           "bool": "?", "bfloat16": "H"}  # (16-bit floats as their bits: pycuda packs no half)
_FLOAT16 = ("float16", "bfloat16")
_POINTERS = ("output", "temp", "input", "scratch")


def _bits16(value, dtype: str) -> int:
    """A half or bfloat16 scalar's bits (it reaches the launch as a number)."""
    import ml_dtypes
    kind = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    return int(np.array(value, kind).view(np.uint16))


def _host(dtype) -> np.dtype:
    """The dtype pycuda moves an array as: half and bfloat16 (which pycuda's kernels for filling
    and copying do not know: "unable to map dtype 'float16'" on an H200) as their 16-bit words."""
    return np.dtype(np.uint16) if np.dtype(dtype).name in _FLOAT16 else np.dtype(dtype)


@functools.cache  # a failure raises, and is not cached: a later call tries again
def _pycuda():
    """pycuda's driver, compiler and gpuarray modules, with a clear error if they cannot work."""
    try:
        import pycuda.compiler as compiler
        import pycuda.driver as driver
        import pycuda.gpuarray as gpuarray
    except ImportError as e:
        raise TCError(f"target='cuda' launches kernels with pycuda, which cannot be imported "
                      f"({e})", notes=("install it with: pip install 'tcstage[cuda]'",
                                       "without a GPU, target='cuda-emulated' runs the same "
                                       "CUDA source on the CPU")) from None
    try:
        driver.init()
        if driver.Device.count() == 0:
            raise TCError("target='cuda' needs an NVIDIA GPU, and the CUDA driver sees none")
        import pycuda.autoprimaryctx  # noqa: F401  (the primary context, shared with PyTorch)
        # (the module is pycuda's autoprimaryctx: autoprimary, named once here by mistake, was
        # the first thing that failed when tcstage first met a GPU)
    except driver.Error as e:
        raise TCError(f"target='cuda' needs a working CUDA driver and GPU: {e}",
                      notes=("target='cuda-emulated' runs the same CUDA source on the CPU",)) \
            from None
    return driver, compiler, gpuarray


@contextlib.contextmanager
def primary_context():
    """The primary context, made current on this thread for the block where none is (a launch
    from a thread pool's worker found none: pycuda makes it current on the importing thread)."""
    driver, _, _ = _pycuda()
    if driver.Context.get_current() is not None:
        yield
        return
    import pycuda.autoprimaryctx
    pycuda.autoprimaryctx.context.push()
    try:
        yield
    finally:
        driver.Context.pop()


@contextlib.contextmanager
def driver_errors(what: str, notes: tuple[str, ...] = ()):
    """Runs driver calls (compiling, launching, allocating, copying) in the primary context,
    with pycuda's errors as TCErrors saying what tcstage was doing."""
    driver, _, _ = _pycuda()
    try:
        with primary_context():
            yield
    except driver.Error as e:
        detail = str(e).strip() or type(e).__name__
        raise TCError(f"{what} failed: {detail}", notes=notes) from e


class Launcher:
    """A kernel compiled for the current device, launched with prepared calls."""

    def __init__(self, cuda: CudaKernel):
        driver, compiler, _ = _pycuda()
        self.cuda = cuda
        with driver_errors("querying the GPU"):
            major, minor = driver.Context.get_device().compute_capability()
        arch = f"sm_{major}{minor}"
        with driver_errors(f"compiling kernel '{cuda.name}' with pycuda for {arch}",
                           ("kernel.cuda_source holds the CUDA source; tcstage.cuda.nvcc."
                            "compile_check(source) compiles it with nvcc",)):
            module = compiler.SourceModule(cuda.source, no_extern_c=True, arch=arch,
                                           options=["-std=c++17"])
            self.function = module.get_function(cuda.name)
            self.function.prepare("".join("P" if p.kind in _POINTERS else _STRUCT[p.dtype]
                                          for p in cuda.parameters))
        self.bits16 = [p.dtype if p.kind == "scalar" and p.dtype in _FLOAT16 else None
                       for p in cuda.parameters]

    def __call__(self, values, grid=None) -> None:
        """Launches on `grid` (a dynamic kernel's, for the call's sizes), else the compiled one."""
        grid = self.cuda.grid if grid is None else grid
        values = [_bits16(v, b) if b else v for v, b in zip(values, self.bits16)]
        with driver_errors(f"launching kernel '{self.cuda.name}' on grid {grid}, "
                           f"block {self.cuda.block}"):
            self.function.prepared_call(grid, self.cuda.block, *values)


def device_pointer(a, name: str) -> int:
    """The device address of a C-contiguous array exposing `__cuda_array_interface__` (or of a
    PyTorch tensor: bfloat16 ones expose none)."""
    if type(a).__module__.split(".")[0] == "torch" and str(a.dtype) == "torch.bfloat16":
        if not a.is_contiguous():
            raise TCArgumentError(f"{name} is not C-contiguous on the device; pass a contiguous "
                                  "copy (.contiguous())")
        return int(a.data_ptr())
    iface = a.__cuda_array_interface__
    shape, strides = tuple(iface["shape"]), iface.get("strides")
    itemsize = np.dtype(iface["typestr"]).itemsize
    if strides is not None and tuple(strides) != _c_strides(shape, itemsize):
        raise TCArgumentError(f"{name} is not C-contiguous on the device (strides {strides}); "
                              "pass a contiguous copy (e.g. .contiguous() in PyTorch)")
    return int(iface["data"][0])


def _c_strides(shape, itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(out))


def _allocator(arrays, gpuarray):
    """zeros(shape, dtype) in the framework of the first device array among the arguments."""
    for a in arrays:
        framework = type(a).__module__.split(".")[0]
        if framework == "torch":
            import torch

            def torch_zeros(shape, dtype, like=a):
                # (torch.from_numpy knows no bfloat16: numpy has none but ml_dtypes')
                t = torch.bfloat16 if np.dtype(dtype).name == "bfloat16" else \
                    torch.from_numpy(np.empty(0, dtype)).dtype
                return torch.zeros(shape, dtype=t, device=like.device)
            return torch_zeros
        if framework == "cupy":
            import cupy
            return cupy.zeros
    return gpuarray.zeros


def _gpu_zeros(gpuarray, shape, dtype):
    """pycuda's zeros, but for no elements an array without memory (its fill needs some)."""
    if 0 in tuple(shape):
        return gpuarray.GPUArray(tuple(shape), dtype)
    return gpuarray.zeros(shape, dtype)


def stage_on_gpu(kernel, binding):
    """Device buffers and launch values for `kernel` (a runtime.Kernel) on the bound arguments;
    returns (values, finish), where finish() brings the outputs back: numpy arrays for numpy
    inputs, else arrays of the inputs' framework."""
    _, _, gpuarray = _pycuda()
    fn = kernel.compiled.fn
    device = [a for a in (*binding.arrays.values(), *binding.inout.values())
              if not isinstance(a, np.ndarray)]
    zeros = _allocator(device, gpuarray)
    staged = {}  # numpy array id -> its device copy, alive as long as the call

    def pointer(a, name="argument"):
        # (pycuda gives an array with no elements no memory, gpudata None: a kernel reads
        # nothing of an empty input, `lower`'s absent ones, and writes nothing of an empty output)
        if isinstance(a, gpuarray.GPUArray):
            return np.intp(0 if a.gpudata is None else int(a.gpudata))
        if isinstance(a, np.ndarray):
            if not a.size:
                return np.intp(0)
            copy = staged.get(id(a))
            if copy is None:
                copy = staged[id(a)] = gpuarray.to_gpu(
                    np.ascontiguousarray(a).view(_host(a.dtype)))
            return np.intp(int(copy.gpudata))
        return np.intp(device_pointer(a, name))

    buffers = {}
    with driver_errors(f"allocating and copying the arrays of '{fn.name}' to the GPU"):
        for name, shape in kernel.buffer_shapes_for(binding.sizes).items():
            dtype = fn.checked.tensors[name].type.numpy
            buffers[name] = binding.inout[name] if name in binding.inout else \
                (zeros(shape, dtype) if device else _gpu_zeros(gpuarray, shape, _host(dtype)))
        for name, (shape, dtype) in kernel.scratch.items():
            buffers[name] = zeros(shape, dtype) if device else \
                _gpu_zeros(gpuarray, shape, _host(dtype))
        values = kernel.launch_values(binding, buffers, pointer)

    def finish():
        results = []
        # (launches are asynchronous: a kernel's own failure shows here)
        with driver_errors(f"running kernel '{kernel.name}' and copying its outputs back"):
            for name in fn.checked.outputs:
                b = buffers[name]
                dtype = fn.checked.tensors[name].type.numpy
                if isinstance(b, np.ndarray):  # an in/out numpy output: copy back in place
                    if b.size:
                        b[...] = staged[id(b)].get().view(dtype)
                    results.append(b)
                elif not device and isinstance(b, gpuarray.GPUArray):
                    results.append(b.get().view(dtype))
                else:
                    results.append(b)
        return results[0] if len(results) == 1 else tuple(results)

    return values, finish
