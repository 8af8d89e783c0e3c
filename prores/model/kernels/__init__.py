"""Residual-add + norm kernels behind :mod:`prores.model.fused`: reference (eager), compiled, triton."""
