"""Counting the points of isl sets whose parameters are all fixed (no barvinok in islpy):
exact for boxes and full tiles, an upper bound for other shapes. Used by the cost model, the
GPU-use report and overlapped tiles' recomputation."""

from __future__ import annotations

import islpy as isl


def max_int(pw: isl.PwAff) -> int | None:
    if pw.is_empty() if hasattr(pw, "is_empty") else False:
        return None
    v = pw.max_val()
    return int(v.to_python()) if v.is_int() else None


def count(s: isl.Set) -> int:
    """Points of s (no free parameters but fixed ones), as the product over dimensions of the
    largest extent given the outer ones, divided by the stride: exact for boxes and full
    tiles, an upper bound otherwise."""
    if s.is_empty():
        return 0
    n = s.dim(isl.dim_type.set)
    total = 1
    for k in range(n):
        proj = s.project_out(isl.dim_type.set, k + 1, n - k - 1)
        m = isl.Map.from_range(proj).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, k)
        hi = m.lexmax_pw_multi_aff().get_at(0)
        lo = m.lexmin_pw_multi_aff().get_at(0)
        extent = max_int(hi.sub(lo))
        if extent is None:
            return _box_count(s)
        stride = proj.get_stride(k)
        stride = int(stride.to_python()) if stride.is_int() and stride.is_pos() else 1
        total *= extent // stride + 1
    return total


def elements(s: isl.Set) -> int:
    """Points of s, a union of pieces counted apart once made disjoint (fixed parameters)."""
    pieces = []
    s.make_disjoint().foreach_basic_set(lambda b: pieces.append(isl.Set.from_basic_set(b)))
    return sum(count(p) for p in pieces)


def _box_count(s: isl.Set) -> int:
    total = 1
    for k in range(s.dim(isl.dim_type.set)):
        lo, hi = max_int(s.dim_min(k).neg()), max_int(s.dim_max(k))
        if lo is None or hi is None:
            return 0
        total *= hi + lo + 1
    return total


def box_extents(s: isl.Set) -> list[int] | None:
    """The box hull's extent per dimension (None if unbounded)."""
    out = []
    for k in range(s.dim(isl.dim_type.set)):
        lo, hi = max_int(s.dim_min(k).neg()), max_int(s.dim_max(k))
        if lo is None or hi is None:
            return None
        out.append(hi + lo + 1)
    return out
