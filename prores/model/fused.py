"""The one place where a block adds a branch to its residual stream.

Every norm layout is written in terms of three calls:

* ``norm(x, n)``                    -> Norm(x)
* ``add(x, f, alpha, c)``            -> c·x + alpha·f
* ``add_norm(x, f, alpha, n, c)``    -> (h, Norm(h)) with h = c·x + alpha·f

``alpha`` is a 0-dim fp32 tensor, or ``None`` once the ProRes schedule has
saturated at 1: then no multiply is issued at all, so the block is bitwise
the plain residual block. ``c`` (DeepNorm's skip constant) is a Python float
fixed at build time. The eager versions below are the reference; fused
backends plug in behind the same signatures.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from prores.model.norm import Norm


def norm(x: torch.Tensor, n: Norm) -> torch.Tensor:
    weight, bias = n.affine()
    if n.kind == "layernorm":
        return F.layer_norm(x, weight.shape, weight, bias, n.eps)
    return F.rms_norm(x, weight.shape, weight, n.eps)


def add(x: torch.Tensor, f: torch.Tensor, alpha: Optional[torch.Tensor], skip_scale: float = 1.0) -> torch.Tensor:
    if skip_scale != 1.0:
        x = x * skip_scale
    return x + f if alpha is None else x + alpha * f


def add_norm(
    x: torch.Tensor, f: torch.Tensor, alpha: Optional[torch.Tensor], n: Norm, skip_scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    h = add(x, f, alpha, skip_scale)
    return h, norm(h, n)
