"""Depth-µP and CompleteP: a branch multiplier (L/L_base)^(−α), and the blocks' learning rate and AdamW
epsilon rescaled with depth (Yang et al. 2023, arXiv 2310.02244; Bordelon et al. 2023, arXiv 2309.16620;
Dey et al. 2025, arXiv 2505.01618, α = 1 being CompleteP), as EleutherAI's nanoGPT-mup and torchtitan's
CompleteP port apply them to AdamW: every residual branch times m = (L/L_base)^(−α), the hidden (block)
parameters' learning rate times (L/L_base)^(α−1) and their epsilon times (L/L_base)^(−α); the embedding,
the final norm and the head keep the base values. ``model.depth_mup_alpha = 0`` turns it off.
"""

from __future__ import annotations


def depth_ratio(m) -> float:
    return m.num_layers / m.depth_mup_base


def branch_multiplier(m) -> float:
    """m = (L/L_base)^(−α); with ProRes the two multiply."""
    return depth_ratio(m) ** -m.depth_mup_alpha if m.depth_mup_alpha else 1.0


def hidden_optimizer_scales(m) -> tuple[float, float]:
    """(learning-rate factor, AdamW-epsilon factor) of a block's parameters."""
    if not m.depth_mup_alpha:
        return 1.0, 1.0
    r, a = depth_ratio(m), m.depth_mup_alpha
    return r ** (a - 1), r ** -a
