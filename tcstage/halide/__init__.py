"""Bridges between tcstage and Halide."""
