"""Cutting a full tensor into its tensor-parallel shard and gluing shards back.

Both follow Megatron's own parameter attributes (``tensor_model_parallel``,
``partition_dim``, ``partition_stride``): a dimension of size ``n`` is viewed as
``[stride, tp, n / (stride·tp)]`` and rank r holds ``[:, r]``. Stride 2 is
SwiGLU's fc1, whose full rows are [gate; up] and whose shard is [gate_r; up_r].
"""

from __future__ import annotations

import torch


def is_sharded(param) -> bool:
    return bool(getattr(param, "tensor_model_parallel", False))


def _split_view(t: torch.Tensor, dim: int, stride: int, parts: int) -> torch.Tensor:
    return t.reshape(*t.shape[:dim], stride, parts, t.shape[dim] // (stride * parts), *t.shape[dim + 1:])


def shard(full: torch.Tensor, param, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This rank's slice of ``full`` for ``param``."""
    if not is_sharded(param) or tp_size == 1:
        return full
    dim, stride = param.partition_dim, getattr(param, "partition_stride", 1)
    return _split_view(full, dim, stride, tp_size).select(dim + 1, tp_rank).reshape(param.shape)


def unshard(shards: list[torch.Tensor], param) -> torch.Tensor:
    """Inverse of :func:`shard`: the full tensor from every rank's shard, in rank order."""
    if not is_sharded(param) or len(shards) == 1:
        return shards[0]
    dim, stride = param.partition_dim, getattr(param, "partition_stride", 1)
    local = shards[0]
    stacked = torch.stack([_split_view(s, dim, stride, 1).squeeze(dim + 1) for s in shards], dim=dim + 1)
    shape = list(local.shape)
    shape[dim] *= len(shards)
    return stacked.reshape(shape)
