"""TC's scalar types, their spellings, and the promotion rule for mixed arithmetic.

Promotion follows Halide's (tcstage lowers to Halide, so both agree): a float beats an integer;
the wider of two floats or two same-signedness integers wins; a signed/unsigned mix becomes a
signed integer of the larger width. Literals are *weak*: they take the type of the operand beside
them, so `0.5 * X(i)` stays `half` when X is half, and `X(i) + 1` stays `uint8` for uint8 X.

`bfloat16` is a float kind of its own (Halide's BFloat(16), CUDA's `__nv_bfloat16`, numpy arrays of
`ml_dtypes.bfloat16`): it has float32's exponent range and 8 significant bits. Neither half nor
bfloat16 holds the other's values, so their mix is float32, the narrowest type holding both.
"""

from __future__ import annotations

import functools

import attrs
import ml_dtypes
import numpy as np


@attrs.frozen
class ScalarType:
    kind: str  # 'float', 'bfloat', 'int', 'uint' or 'bool'
    bits: int

    @property
    def name(self) -> str:
        return "bool" if self.kind == "bool" else f"{self.kind}{self.bits}"

    @property
    def is_float(self) -> bool:
        return self.kind in ("float", "bfloat")

    @property
    def is_narrow_float(self) -> bool:
        """half or bfloat16: a type whose sums are accumulated in float32 (lang/accumulate.py)."""
        return self.is_float and self.bits == 16

    @property
    def is_int(self) -> bool:
        """Integer-valued (bool included): usable as a subscript."""
        return self.kind in ("int", "uint", "bool")

    @property
    def numpy(self) -> np.dtype:
        if self.kind == "bfloat":  # (numpy has no bfloat16 of its own)
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(np.bool_ if self.kind == "bool" else self.name)

    @property
    def c_name(self) -> str:
        """The C/CUDA spelling."""
        return {"float16": "half", "bfloat16": "__nv_bfloat16", "float32": "float",
                "float64": "double", "bool": "bool"}.get(self.name, f"{self.name}_t")

    def __str__(self) -> str:
        return self.name


FLOAT16, FLOAT32, FLOAT64 = ScalarType("float", 16), ScalarType("float", 32), ScalarType("float", 64)
BFLOAT16 = ScalarType("bfloat", 16)
INT32, INT64 = ScalarType("int", 32), ScalarType("int", 64)
UINT64 = ScalarType("uint", 64)
BOOL = ScalarType("bool", 1)

#: Every spelling TC accepts for a scalar type.
SCALAR_TYPES: dict[str, ScalarType] = {
    "float": FLOAT32, "float32": FLOAT32, "double": FLOAT64, "float64": FLOAT64,
    "half": FLOAT16, "float16": FLOAT16, "bfloat16": BFLOAT16,
    **{f"int{b}": ScalarType("int", b) for b in (8, 16, 32, 64)},
    **{f"uint{b}": ScalarType("uint", b) for b in (8, 16, 32, 64)},
    "int": INT32, "byte": ScalarType("uint", 8), "bool": BOOL,
}


_BFLOAT16_DTYPE = np.dtype(ml_dtypes.bfloat16)


@functools.lru_cache(maxsize=64)
def from_numpy(dtype: np.dtype) -> ScalarType | None:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return BOOL
    if dtype == _BFLOAT16_DTYPE:
        return BFLOAT16
    kind = {"f": "float", "i": "int", "u": "uint"}.get(dtype.kind)
    return ScalarType(kind, dtype.itemsize * 8) if kind else None


def promote(a: ScalarType, b: ScalarType) -> ScalarType:
    """The common type of a binary arithmetic operation on strongly typed operands."""
    if a == b:
        return a
    if a.is_float or b.is_float:
        if a.is_float and b.is_float:
            if a.bits == b.bits:  # half and bfloat16
                return FLOAT32
            return a if a.bits > b.bits else b
        return a if a.is_float else b
    if a.kind == "bool":
        return b
    if b.kind == "bool":
        return a
    bits = max(a.bits, b.bits)
    return ScalarType(a.kind if a.kind == b.kind else "int", bits)


def integer_range(t: ScalarType) -> tuple[int, int]:
    """The least and greatest value of an integer type (bool: 0 and 1)."""
    if t.kind == "bool":
        return 0, 1
    if t.kind == "int":
        return -(1 << t.bits - 1), (1 << t.bits - 1) - 1
    return 0, (1 << t.bits) - 1


def cast_value(value: int | float | bool, t: ScalarType) -> int | float | bool:
    """A constant converted to t as a cast converts at run time (docs/language.md, Casts): to an
    integer type, a float is truncated toward zero and saturated to the type's range, NaN giving
    0, and an integer wraps to the type's width; to a float type, the value is rounded to
    nearest even; to bool, any non-zero value is true."""
    if t.kind == "bool":
        return bool(value)
    if t.is_float:
        return float(np.array(float(value), np.float64).astype(t.numpy))
    low, high = integer_range(t)
    if isinstance(value, float):
        if value != value:
            return 0
        if value >= high + 1:
            return high
        if value < low:
            return low
        return int(value)  # (int() truncates toward zero)
    wrapped = int(value) & ((1 << t.bits) - 1)
    return wrapped - (1 << t.bits) if t.kind == "int" and wrapped > high else wrapped
