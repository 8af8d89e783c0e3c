"""Residual-add + norm kernels behind :mod:`prores.model.fused`, and the two registries they implement.

Both are plain names, importable without torch (``prores.config`` reads them): a backend's module is
imported only when a run picks it.
"""

# kernels.backend -> the module that implements norm, add and add_norm
BACKENDS = {
    "eager": "prores.model.kernels.reference",
    "compile": "prores.model.kernels.compiled",
    "triton": "prores.model.kernels.triton_ops",
    "block": "prores.model.kernels.reference",  # the eager formulas, each block compiled whole (block_compile)
}

# model.norm -> what it computes
NORMS = {
    "layernorm": "(x - mean)/sqrt(var + eps)·γ + β",
    "rmsnorm": "x/sqrt(mean(x²) + eps)·γ",
    "dyt": "γ⊙tanh(a·x), a learnable scalar from model.dyt_init, and the embedding's output times a learnable"
           " scalar from √h, as in the paper's LLaMA runs (Zhu et al. 2025, arXiv 2503.10622; jiachenzhu/DyT"
           " other_tasks/LLaMA); not a normalisation, so computed unfused",
}
