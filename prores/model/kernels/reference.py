"""The eager reference: plain torch ops on tensors. Every other backend must match it.

``alpha`` is a 0-dim fp32 tensor, or None for exactly 1 (no multiply); ``gain``
(a residual method's learnable branch gain: one scalar or one per channel) is
None or multiplies the branch too: h = x + alpha·gain⊙f, gain⊙f in the branch's
dtype, as the Triton kernel gets it (so autograd keeps f as it came, for the
gain's gradient, on every backend). ``bias`` may be None;
RMSNorm takes one too (added after the gain). DyT (:func:`dyt`) is not a
normalisation, so no backend fuses it: every backend calls this one.

Arithmetic is fp32 whatever the storage dtype, as in the fused kernels: the
norm sees the unrounded sum x + alpha·f, and only the outputs are rounded.
For fp32 and fp64 inputs the casts are no-ops.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def up(t: Tensor) -> Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _norm_up(h: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float, rms: bool) -> Tensor:
    w = up(weight).to(h.dtype)
    b = None if bias is None else up(bias).to(h.dtype)
    if not rms:
        return F.layer_norm(h, w.shape, w, b, eps)
    y = F.rms_norm(h, w.shape, w, eps)
    return y if b is None else y + b


def norm(x: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float, rms: bool) -> Tensor:
    return _norm_up(up(x), weight, bias, eps, rms).to(x.dtype)


def add(x: Tensor, f: Tensor, alpha: Optional[Tensor], gain: Optional[Tensor] = None) -> Tensor:
    if gain is not None:
        f = gain * f
    return x + f if alpha is None else x + alpha * f


def add_norm(x: Tensor, f: Tensor, alpha: Optional[Tensor], weight: Tensor, bias: Optional[Tensor], eps: float,
             rms: bool, gain: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    if gain is not None:
        f = gain * f
    h = add(up(x), up(f), alpha)
    return h.to(x.dtype), _norm_up(h, weight, bias, eps, rms).to(x.dtype)


def dyt(x: Tensor, alpha: Tensor, weight: Tensor) -> Tensor:
    """Dynamic Tanh, weight⊙tanh(alpha·x) (Zhu et al. 2025, as in its LLaMA runs), in fp32 arithmetic."""
    return (up(weight) * torch.tanh(up(alpha) * up(x))).to(x.dtype)
