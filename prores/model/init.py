"""Init schemes and layout-invariant seeding.

A parameter's initial value depends only on (seed, global layer index,
parameter name): the FULL tensor is drawn from a generator seeded by those
three, then the local tensor-parallel shard is cut from it with Megatron's
own partition attributes. So TP, PP and DP never change the numbers, and
neither does the order in which layers are built.

Layer index 0 is the embedding, 1..L the blocks, L+1 the final norm and head.
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import nn

from megatron.core import parallel_state

from prores.parallel.sharding import is_sharded, shard

INIT_SCHEMES = {
    "normal": "std on every matrix",
    "scaled": "std/sqrt(2L) on output projections",
    "ds-init": "std/sqrt(2l) on output projections, l the global block index",
    "deepnorm": "DeepNet gains (8L)^(-1/4) on value, output and MLP weights; 1 on query and key",
}

OUTPUT_PROJECTIONS = ("linear_proj.weight", "linear_fc2.weight")
DEEPNORM_GAINED = ("linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight")


def param_seed(seed: int, layer: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}/{layer}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def matrix_std(scheme: str, std: float, name: str, layer: int, num_layers: int) -> float:
    if name.endswith(OUTPUT_PROJECTIONS):
        if scheme == "scaled":
            return std / math.sqrt(2 * num_layers)
        if scheme == "ds-init":
            return std / math.sqrt(2 * layer)
    if scheme == "deepnorm" and name.endswith(DEEPNORM_GAINED):
        return std * (8 * num_layers) ** -0.25
    return std


def full_shape(param: torch.Tensor, tp_size: int) -> list[int]:
    shape = list(param.shape)
    if is_sharded(param):
        shape[param.partition_dim] *= tp_size
    return shape


def initial_value(name: str, param: torch.Tensor, *, layer: int, num_layers: int, scheme: str, std: float,
                  seed: int, num_heads: int, tp_size: int) -> torch.Tensor:
    """The full (unsharded) initial tensor for one parameter, in fp32 on CPU."""
    shape = full_shape(param, tp_size)
    if param.dim() == 1:  # the only vectors are norm gains (start at 1) and biases (start at 0)
        return torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
    gen = torch.Generator().manual_seed(param_seed(seed, layer, name))
    full = torch.randn(shape, generator=gen) * matrix_std(scheme, std, name, layer, num_layers)
    if scheme == "deepnorm" and name.endswith("linear_qkv.weight"):
        # Megatron's fused QKV rows are [head, (q, k, v), head_dim]; only v gets the gain.
        per_head = full.view(num_heads, 3, -1, shape[-1])
        per_head[:, 2] *= (8 * num_layers) ** -0.25
    return full


@torch.no_grad()
def init_parameters(module: nn.Module, *, layer: int, num_layers: int, scheme: str, std: float, seed: int,
                    num_heads: int, tp_rank: int, tp_size: int) -> None:
    for name, param in module.named_parameters():
        full = initial_value(name, param, layer=layer, num_layers=num_layers, scheme=scheme, std=std,
                             seed=seed, num_heads=num_heads, tp_size=tp_size)
        param.copy_(shard(full, param, tp_rank, tp_size))


def init_piece(module: nn.Module, model_cfg, layer: int, seed: int) -> None:
    """Initialise a model piece in place for this process's tensor-parallel rank."""
    init_parameters(module, layer=layer, num_layers=model_cfg.num_layers, scheme=model_cfg.init,
                    std=model_cfg.init_std, seed=seed, num_heads=model_cfg.num_heads,
                    tp_rank=parallel_state.get_tensor_model_parallel_rank(),
                    tp_size=parallel_state.get_tensor_model_parallel_world_size())
