"""TC's builtin functions: the CUDA math functions TC users expect.

Each has a canonical name (what the back ends map); CUDA's single-precision spellings (`expf`,
`fmaxf`, ...) are aliases that convert their arguments to float32, as C would.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Builtin:
    canonical: str
    arity: int
    kind: str  # 'float': float math; 'any': keeps the promoted argument type
    force_float32: bool = False


_FLOAT_UNARY = ("exp", "log", "sqrt", "rsqrt", "tanh", "sin", "cos", "tan", "asin", "acos",
                "atan", "sinh", "cosh", "exp2", "log2", "log10", "erf", "floor", "ceil",
                "round", "trunc", "fabs", "sigmoid")
_FLOAT_BINARY = ("pow", "fmax", "fmin", "atan2", "fmod")

BUILTINS: dict[str, Builtin] = {}
for _name in _FLOAT_UNARY:
    BUILTINS[_name] = Builtin(_name, 1, "float")
    if _name != "sigmoid":
        BUILTINS[_name + "f"] = Builtin(_name, 1, "float", force_float32=True)
for _name in _FLOAT_BINARY:
    BUILTINS[_name] = Builtin(_name, 2, "float")
    BUILTINS[_name + "f"] = Builtin(_name, 2, "float", force_float32=True)
BUILTINS.update({
    "max": Builtin("max", 2, "any"),
    "min": Builtin("min", 2, "any"),
    "abs": Builtin("abs", 1, "any"),
})
