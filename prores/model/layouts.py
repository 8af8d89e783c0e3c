"""Residual methods ("norm layouts"): where a block's norms sit, which gains its residual branches carry,
where alpha goes. Each method is one declaration (:class:`Layout`), and the only place it is written:
the block builds its norms and gains from it, the init draws them, the planner counts them, and the
per-layer diagnostics log the gains. Adding a method is one entry here, plus its tests.

Every forward is written with the block's :class:`prores.model.fused.FusedOps`. ``a`` is the block's alpha
(ProRes times any fixed branch multiplier, such as depth-µP's), ``F`` the attention or MLP branch, ``λ``,
``s``, ``ω`` learnable gains:

* pre:        x + a·F(Norm(x))
* post:       Norm(x + a·F(x))
* sandwich:   x + a·Norm(F(Norm(x)))
* deepnorm:   Norm(c·x + a·F(x)), c = (2L)^(1/4)
* lns:        x + a·F(Norm(x)/sqrt(l))
* layerscale: x + a·λ⊙F(Norm(x))
* rezero:     x + a·s·F(x), no norm
* admin:      Norm(ω⊙x + a·F(x))
* mixln:      post in blocks l <= ⌊ρL⌋, pre after
* periln:     sandwich, and a norm on the embedding's output
* hybridnorm: x' = x + a·Attn_QKVnorm(x); y = Norm(x') + a·FFN(Norm(x'))

Plain data and functions only (no torch): :mod:`prores.config` reads the registry's names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


def _pre(b, x):
    h, y = b.ops.add_norm(x, b.attention_branch(b.ops.norm(x, b.norm1)), b.alpha, b.norm2, b.gain("attn"))
    return b.ops.add(h, b.mlp_branch(y), b.alpha, b.gain("mlp"))


def _post(b, x):
    h = b.ops.post_norm(x, b.attention_branch(x), b.alpha, b.norm1, b.skip_scale, skip_gain=b.gain("attn_skip"))
    return b.ops.post_norm(h, b.mlp_branch(h), b.alpha, b.norm2, b.skip_scale, skip_gain=b.gain("mlp_skip"))


def _sandwich(b, x):
    # Not fusable further: the branch norm (norm1_post) reads F's output, which the
    # residual add needs only after that norm; the add itself fuses with norm2.
    f = b.ops.norm(b.attention_branch(b.ops.norm(x, b.norm1)), b.norm1_post)
    h, y = b.ops.add_norm(x, f, b.alpha, b.norm2)
    return b.ops.add(h, b.ops.norm(b.mlp_branch(y), b.norm2_post), b.alpha)


def _rezero(b, x):
    h = b.ops.add(x, b.attention_branch(x), b.alpha, b.gain("both"))
    return b.ops.add(h, b.mlp_branch(h), b.alpha, b.gain("both"))


def _mixln(b, x):
    return (_post if b.layer_number <= mixln_post_blocks(b.model_cfg) else _pre)(b, x)


def mixln_post_blocks(m) -> int:
    """Mix-LN's Post-LN blocks: the first ⌊ρ·L⌋."""
    return math.floor(m.mixln_ratio * m.num_layers)


def _hybridnorm(b, x):
    h = b.ops.add(x, b.attention_branch(x), b.alpha)  # Q, K and V are normed inside the attention
    y = b.ops.norm(h, b.norm2)
    return b.ops.add(y, b.mlp_branch(y), b.alpha)


@dataclass(frozen=True)
class Gain:
    """A learnable gain on a branch (``attn``, ``mlp``, ``both``) or on a skip (``attn_skip``, ``mlp_skip``):
    one scalar, or one value per channel; ``init(l, L, model_cfg)`` is its initial value."""

    on: str
    per_channel: bool
    init: Callable


def _layerscale_init(l: int, L: int, m) -> float:
    """model.layerscale_init, or CaiT's rule by depth: 0.1 up to 18 blocks, 1e-5 up to 24, 1e-6 deeper."""
    return m.layerscale_init or (0.1 if L <= 18 else 1e-5 if L <= 24 else 1e-6)


def _admin_omega(l: int, L: int, m) -> float:
    """admin-torch's closed form for N residual sublayers at its default output change O(log N)
    (``calculate_init``, which returns the square root): ω = √((N + 1)/ln(N + 1) − 1), N = 2L (an attention
    and an MLP sublayer a block)."""
    n = 2 * L
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


@dataclass(frozen=True)
class Layout:
    name: str
    forward: Callable
    norms: tuple[str, ...]
    final_norm: bool  # does the stack end with a norm before the head?
    doc: str  # the block, as a formula
    source: str  # the paper, and the reference code it was checked against
    gains: tuple[Gain, ...] = ()
    skip_scale: Callable[[int], float] = lambda L: 1.0  # c, from the number of blocks
    norm_out_scale: Callable[[int], float] = lambda l: 1.0  # from the global block index
    embedding_norm: bool = False  # a norm on the embedding's output
    qkv_norm: bool = False  # norms on Q, K and V inside the attention (each whole projection)
    embedding_scale: bool = False  # the embedding's output times √h: nothing else sets the stream's scale


LAYOUTS: dict[str, Layout] = {
    lay.name: lay
    for lay in (
        Layout("pre", _pre, ("norm1", "norm2"), final_norm=True, doc="x + a·F(Norm(x))",
               source="Xiong et al. 2020, arXiv 2002.04745"),
        Layout("post", _post, ("norm1", "norm2"), final_norm=False, doc="Norm(x + a·F(x))",
               source="Vaswani et al. 2017, arXiv 1706.03762"),
        Layout("sandwich", _sandwich, ("norm1", "norm1_post", "norm2", "norm2_post"), final_norm=True,
               doc="x + a·Norm(F(Norm(x)))", source="Ding et al. 2021 (CogView), arXiv 2105.13290"),
        Layout("deepnorm", _post, ("norm1", "norm2"), final_norm=False, skip_scale=lambda L: (2 * L) ** 0.25,
               doc="Norm(c·x + a·F(x)), c = (2L)^(1/4); init gains (8L)^(-1/4) on value, output and MLP weights"
                   " (model.init=deepnorm)", source="Wang et al. 2022 (DeepNet), arXiv 2203.00555"),
        Layout("lns", _pre, ("norm1", "norm2"), final_norm=True, norm_out_scale=lambda l: 1 / math.sqrt(l),
               doc="x + a·F(Norm(x)/sqrt(l))", source="Sun et al. 2025 (LayerNorm Scaling), arXiv 2502.05795"),
        Layout("layerscale", _pre, ("norm1", "norm2"), final_norm=True,
               gains=(Gain("attn", True, _layerscale_init), Gain("mlp", True, _layerscale_init)),
               doc="x + a·λ⊙F(Norm(x)), λ per channel and branch, learnable, from model.layerscale_init",
               source="Touvron et al. 2021 (CaiT), arXiv 2103.17239; facebookresearch/deit cait_models.py"),
        Layout("rezero", _rezero, (), final_norm=False, embedding_scale=True,
               gains=(Gain("both", False, lambda l, L, m: m.rezero_init),),
               doc="x + a·s·F(x), no norm; s one learnable scalar a block for both branches, from"
                   " model.rezero_init (0: alpha changes nothing until s moves); the embedding times √h, the"
                   " Transformer's √d_model",
               source="Bachlechner et al. 2020, arXiv 2003.04887; majumderb/rezero"),
        Layout("admin", _post, ("norm1", "norm2"), final_norm=False,
               gains=(Gain("attn_skip", True, _admin_omega), Gain("mlp_skip", True, _admin_omega)),
               doc="Norm(ω⊙x + a·F(x)), ω per channel and sublayer, learnable, from √((N+1)/ln(N+1) − 1)"
                   " with N = 2L sublayers", source="Liu et al. 2020, arXiv 2004.08249; microsoft/admin-torch"),
        Layout("mixln", _mixln, ("norm1", "norm2"), final_norm=True,
               doc="Post-LN in blocks l <= ⌊ρL⌋ (ρ = model.mixln_ratio, l global), Pre-LN after",
               source="Li et al. 2024, arXiv 2412.13795; pixeli99/MixLN"),
        Layout("periln", _sandwich, ("norm1", "norm1_post", "norm2", "norm2_post"), final_norm=True,
               embedding_norm=True, doc="sandwich (x + a·Norm(F(Norm(x)))) with the embedding's output normed",
               source="Kim et al. 2025, arXiv 2502.02732; OLMo-core PeriNormTransformerBlock"),
        Layout("hybridnorm", _hybridnorm, ("norm2",), final_norm=True, qkv_norm=True,
               doc="x' = x + a·Attn(x) with Q, K, V each normed (whole projection); y = Norm(x') + a·FFN(Norm(x'))",
               source="Zhuo et al. 2025, arXiv 2503.04598; BryceZhuo/HybridNorm (OLMo2 config: QKV norm, no"
                      " attention norm, FFN residual after its norm)"),
    )
}
