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

from prores.model.init_schemes import DEEPNORM_SCHEMES, deepnorm_gain, matrix_std
from prores.model.sharding import is_sharded, shard


def param_seed(seed: int, layer: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}/{layer}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def full_shape(param: torch.Tensor, tp_size: int) -> list[int]:
    shape = list(param.shape)
    if is_sharded(param):
        shape[param.partition_dim] *= tp_size
    return shape


EMBEDDING = "word_embeddings.weight"


def embedding_std(model_cfg) -> float:
    """The token embedding's init std (``model.embedding_init``)."""
    scale = math.sqrt(model_cfg.hidden_size) if model_cfg.embedding_init == "sqrt_width" else 1.0
    return model_cfg.init_std * scale


def initial_value(name: str, param: torch.Tensor, *, layer: int, num_layers: int, scheme: str, std: float,
                  seed: int, num_heads: int, tp_size: int, embedding: float, gated: bool = True) -> torch.Tensor:
    """The full (unsharded) initial tensor for one parameter, in fp32 on CPU; ``embedding`` is the token
    embedding's std; ``gated``: fc1 holds two matrices (SwiGLU's gate and up)."""
    shape = full_shape(param, tp_size)
    if param.dim() == 1:  # vectors: norm gains (start at 1) and biases (start at 0); others declare theirs
        return torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
    gen = torch.Generator().manual_seed(param_seed(seed, layer, name))
    parts = 3 if name.endswith("linear_qkv.weight") else 2 if gated and name.endswith("linear_fc1.weight") else 1
    fans = (shape[-1], shape[0] // parts)
    full = torch.randn(shape, generator=gen) * (embedding if name.endswith(EMBEDDING) else
                                                matrix_std(scheme, std, name, layer, num_layers, fans))
    if scheme in DEEPNORM_SCHEMES and name.endswith("linear_qkv.weight"):
        # Megatron's fused QKV rows are [head, (q, k, v), head_dim]; only v gets the gain.
        per_head = full.view(num_heads, 3, -1, shape[-1])
        per_head[:, 2] *= deepnorm_gain(num_layers)
    return full


def declared_values(module: nn.Module) -> dict[str, float]:
    """The constant initial values a piece's modules declare (``initial_values()``: a residual method's
    gains, DyT's alpha), by full parameter name."""
    out = {}
    for prefix, sub in module.named_modules():
        for name, value in getattr(sub, "initial_values", dict)().items():
            out[f"{prefix}.{name}" if prefix else name] = value
    return out


@torch.no_grad()
def init_parameters(module: nn.Module, *, layer: int, num_layers: int, scheme: str, std: float, seed: int,
                    num_heads: int, tp_rank: int, tp_size: int, embedding: float, gated: bool = True) -> None:
    constants = declared_values(module)
    for name, param in module.named_parameters():
        if name in constants:
            param.fill_(constants[name])
            continue
        full = initial_value(name, param, layer=layer, num_layers=num_layers, scheme=scheme, std=std,
                             seed=seed, num_heads=num_heads, tp_size=tp_size, embedding=embedding, gated=gated)
        param.copy_(shard(full, param, tp_rank, tp_size))


def init_piece(module: nn.Module, model_cfg, layer: int, seed: int, tp: tuple[int, int]) -> None:
    """Initialise a model piece in place for tensor-parallel rank ``tp[0]`` of ``tp[1]``."""
    init_parameters(module, layer=layer, num_layers=model_cfg.num_layers, scheme=model_cfg.init,
                    std=model_cfg.init_std, seed=seed, num_heads=model_cfg.num_heads, tp_rank=tp[0], tp_size=tp[1],
                    embedding=embedding_std(model_cfg), gated=model_cfg.mlp == "swiglu")
