"""Init schemes: the std of each weight matrix, from its name and its block's place in the stack.

Plain arithmetic, importable without torch (``prores.config`` reads the registry); the tensors are
drawn in :mod:`prores.model.init`.
"""

from __future__ import annotations

import math

INIT_SCHEMES = {
    "normal": "std on every matrix",
    "scaled": "std/sqrt(2L) on output projections",
    "ds-init": "std/sqrt(2l) on output projections, l the global block index",
    "deepnorm": "DeepNet gains (8L)^(-1/4) on value, output and MLP weights; 1 on query and key",
    "deepnorm-xavier": "the ProRes paper's code's DeepNorm: xavier_normal_ (std √(2/(fan_in+fan_out)) of each"
                       " unfused matrix) times the DeepNet gains; the embedding and head as model.init_std says",
}
DEEPNORM_SCHEMES = ("deepnorm", "deepnorm-xavier")  # the schemes of, and only of, the deepnorm layout

OUTPUT_PROJECTIONS = ("linear_proj.weight", "linear_fc2.weight")
DEEPNORM_GAINED = ("linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight")


def deepnorm_gain(num_layers: int) -> float:
    return (8 * num_layers) ** -0.25


def matrix_std(scheme: str, std: float, name: str, layer: int, num_layers: int,
               fans: tuple[int, int] = (0, 0)) -> float:
    """The std of matrix ``name``; ``fans``: (fan_in, fan_out) of one unfused matrix (Q, K or V of the fused
    QKV, the gate or up half of a gated fc1), which only deepnorm-xavier reads."""
    if scheme == "deepnorm-xavier" and name.endswith(("linear_qkv.weight", *DEEPNORM_GAINED)):
        std = math.sqrt(2 / sum(fans))  # the gains: as deepnorm's, below
    if name.endswith(OUTPUT_PROJECTIONS):
        if scheme == "scaled":
            return std / math.sqrt(2 * num_layers)
        if scheme == "ds-init":
            return std / math.sqrt(2 * layer)
    if scheme in DEEPNORM_SCHEMES and name.endswith(DEEPNORM_GAINED):
        return std * deepnorm_gain(num_layers)
    return std
