"""LayerNorm / RMSNorm / DyT parameters. The math lives in :mod:`prores.model.fused`."""

from __future__ import annotations

import torch
from torch import nn

from prores.model.kernels import NORMS


class Norm(nn.Module):
    """Affine weight (and bias for LayerNorm), replicated over tensor-parallel ranks; DyT adds its
    learnable scalar ``alpha`` (initial value ``dyt_init``) and, as in the DyT paper's LLaMA runs, where it
    replaces RMSNorm, has no bias.

    ``out_scale`` multiplies the output (LNS uses 1/sqrt(l)); it is folded into
    the affine weight at call time so the norm stays a single op. ``gain_init``: the weight's initial value.
    """

    def __init__(self, kind: str, hidden_size: int, eps: float, out_scale: float = 1.0, dyt_init: float = 0.5,
                 gain_init: float = 1.0):
        super().__init__()
        if kind not in NORMS:
            raise ValueError(f"unknown norm {kind!r}; known: {', '.join(NORMS)}")
        self.kind, self.eps, self.out_scale, self.dyt_init, self.gain_init = kind, eps, out_scale, dyt_init, gain_init
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if kind == "layernorm" else None
        self.alpha = nn.Parameter(torch.full((1,), dyt_init)) if kind == "dyt" else None

    def initial_values(self) -> dict[str, float]:
        """Parameters whose initial value is not the default of their kind (:mod:`prores.model.init`)."""
        return ({"alpha": self.dyt_init} if self.alpha is not None else {}) | \
            ({"weight": self.gain_init} if self.gain_init != 1.0 else {})

    def affine(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.out_scale == 1.0:
            return self.weight, self.bias
        bias = None if self.bias is None else self.bias * self.out_scale
        return self.weight * self.out_scale, bias

    def extra_repr(self) -> str:
        return f"{self.kind}, {self.weight.numel()}, eps={self.eps}, out_scale={self.out_scale:g}"
