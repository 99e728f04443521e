"""CUDA C support: a CPU emulator for CUDA kernels (`emulate`) and an nvcc syntax check (`nvcc`)."""
