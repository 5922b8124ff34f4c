"""Kernel and whole-model benchmarks (`hyla bench kernels`, `hyla bench model`)."""
