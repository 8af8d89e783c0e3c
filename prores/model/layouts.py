"""Norm layouts: where the norms sit in a block and where alpha goes.

Each layout is written once, in terms of the block's :class:`prores.model.fused.FusedOps`. ``a`` is
the block's alpha (scaling both branches), ``F`` the attention or MLP branch:

* pre:      x + a·F(Norm(x))
* post:     Norm(x + a·F(x))
* sandwich: x + a·Norm(F(Norm(x)))
* deepnorm: Norm(c·x + a·F(x)), c = (2L)^(1/4)
* lns:      x + a·F(Norm(x)/sqrt(l))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable



def _pre(b, x):
    h, y = b.ops.add_norm(x, b.attention_branch(b.ops.norm(x, b.norm1)), b.alpha, b.norm2)
    return b.ops.add(h, b.mlp_branch(y), b.alpha)


def _post(b, x):
    h = b.ops.post_norm(x, b.attention_branch(x), b.alpha, b.norm1, b.skip_scale)
    return b.ops.post_norm(h, b.mlp_branch(h), b.alpha, b.norm2, b.skip_scale)


def _sandwich(b, x):
    # Not fusable further: the branch norm (norm1_post) reads F's output, which the
    # residual add needs only after that norm; the add itself fuses with norm2.
    f = b.ops.norm(b.attention_branch(b.ops.norm(x, b.norm1)), b.norm1_post)
    h, y = b.ops.add_norm(x, f, b.alpha, b.norm2)
    return b.ops.add(h, b.ops.norm(b.mlp_branch(y), b.norm2_post), b.alpha)


@dataclass(frozen=True)
class Layout:
    name: str
    forward: Callable
    norms: tuple[str, ...]
    final_norm: bool  # does the stack end with a norm before the head?
    skip_scale: Callable[[int], float] = lambda L: 1.0  # c, from the number of blocks
    norm_out_scale: Callable[[int], float] = lambda l: 1.0  # from the global block index


LAYOUTS: dict[str, Layout] = {
    lay.name: lay
    for lay in (
        Layout("pre", _pre, ("norm1", "norm2"), final_norm=True),
        Layout("post", _post, ("norm1", "norm2"), final_norm=False),
        Layout("sandwich", _sandwich, ("norm1", "norm1_post", "norm2", "norm2_post"), final_norm=True),
        Layout("deepnorm", _post, ("norm1", "norm2"), final_norm=False,
               skip_scale=lambda L: (2 * L) ** 0.25),
        Layout("lns", _pre, ("norm1", "norm2"), final_norm=True,
               norm_out_scale=lambda l: 1 / math.sqrt(l)),
    )
}
