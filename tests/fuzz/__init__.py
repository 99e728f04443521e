"""Fuzzing and differential testing of tcstage, shared by the tests and the campaign script.

- `frontend`: random text, grammar-shaped token soup and mutations of the examples, for the
  property "`tc.define` succeeds or raises `TCError`".
- `nodes`: a typed TC syntax tree that knows how to print itself as TC source.
- `programs`: random *well-formed* TC functions with their inputs (seeded, deterministic).
- `reference`: range inference by brute force (spec 001's rounds, each condition solved by
  enumerating integers, never with Halide) and an explicit-loop numpy interpreter of the
  statements (spec 000): the independent oracle.
- `mapping`: random valid `MappingOptions`.
- `differential`: runs one program on every path and classifies what went wrong.
"""
