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
}

OUTPUT_PROJECTIONS = ("linear_proj.weight", "linear_fc2.weight")
DEEPNORM_GAINED = ("linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight")


def deepnorm_gain(num_layers: int) -> float:
    return (8 * num_layers) ** -0.25


def matrix_std(scheme: str, std: float, name: str, layer: int, num_layers: int) -> float:
    if name.endswith(OUTPUT_PROJECTIONS):
        if scheme == "scaled":
            return std / math.sqrt(2 * num_layers)
        if scheme == "ds-init":
            return std / math.sqrt(2 * layer)
    if scheme == "deepnorm" and name.endswith(DEEPNORM_GAINED):
        return std * deepnorm_gain(num_layers)
    return std
