"""Norms over a TP × PP × DP model, each parameter counted once, and an AdamW that clips by the global one.

Each parameter counts once: tensor-parallel shards on every TP rank,
TP-replicated parameters (norm gains) on TP rank 0 only, DeepSpeed's tied
copies (``ds_pipe_replicated``) only on their owning stage; the squares are
summed over all stages and TP ranks of one data-parallel replica.

DeepSpeed's ZeRO-1 optimizer gets the global norm right. Its ZeRO-0 fp32 path
does not: ``deepspeed.runtime.utils.clip_grad_norm_`` counts replicated
parameters only where the pipe×tensor "model parallel rank" is 0, i.e. on the
first stage, and it reports no norm. :class:`GlobalNormAdamW` is used there
instead.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from prores.model.sharding import is_sharded
from prores.parallel.collectives import all_reduce_over


def counted(param, tp_rank: int) -> bool:
    """Whether this rank counts ``param`` in a norm of the whole model."""
    return (is_sharded(param) or tp_rank == 0) and not getattr(param, "ds_pipe_replicated", False)


def reduced_grad_share(param, dp_rank: int) -> Optional[torch.Tensor]:
    """This data-parallel rank's share of ``param``'s gradient after the data-parallel reduction; the
    shares of all DP ranks are disjoint and together the whole gradient. Valid between the reduction
    and the optimizer step. ZeRO-1 and DeepSpeed's bf16 optimizer keep the reduced gradient as
    fragments of flat partitions (``_hp_mapping``); without them every DP rank holds all of it and
    DP rank 0 counts it."""
    if not hasattr(param, "_hp_mapping"):
        return param.grad if dp_rank == 0 else None
    mapping = param._hp_mapping
    if mapping is None:  # no fragment in this rank's partition
        return None
    fragment = mapping.get_lp_grad_fragment(param._index_in_param_group).flatten()
    address = mapping.lp_fragment_address
    if fragment.numel() == param.numel() != address.numel:  # bf16 keeps the whole accumulation buffer
        fragment = fragment.narrow(0, address.start, address.numel)
    return fragment


# CPU's norm kernel sums in fp32 without a cascade, so its error grows with the length: 2e-5 of a squared norm
# at 1M elements, 1e-7 at 32k. Cut into chunks of this many elements, a norm keeps the 1e-7.
NORM_CHUNK = 1 << 15


@torch.no_grad()
def grouped_sq_norms(groups: Sequence[Sequence[torch.nn.Parameter]], tensor_of: Callable, tp_rank: int,
                     reduce_over: Sequence, device) -> torch.Tensor:
    """Squared L2 norm of ``tensor_of(p)`` over each group of parameters, counting each parameter once
    (:func:`counted`), summed over the process groups in ``reduce_over``: one all-reduce each (none over a group of
    one)."""
    parts, group_of = [], []
    for i, params in enumerate(groups):
        for p in params:
            t = tensor_of(p) if counted(p, tp_rank) else None
            if t is not None:
                chunks = t.reshape(-1).split(NORM_CHUNK) if t.numel() > NORM_CHUNK else (t,)
                parts.extend(chunks)
                group_of.extend([i] * len(chunks))
    sq = torch.zeros(len(groups), dtype=torch.float32, device=device)
    if parts:  # one norm call and one addition for all: a deep model has hundreds of small tensors, and four
        # dispatched ops for each (detach, float, square, sum) were most of a stats step
        norms = torch._foreach_norm(parts, 2, dtype=torch.float32)  # bf16 ones accumulated in fp32 too
        sq.index_add_(0, torch.tensor(group_of, device=device), torch.stack(norms).square())
    for group in reduce_over:
        all_reduce_over(sq, group)
    return sq


def count_parameters(params, tp_rank: int, model_parallel_group) -> int:
    """Parameters of the whole model, from one data-parallel replica's shards and stages."""
    # on the parameters' device: NCCL has no CPU backend (gloo takes either, so no CPU test sees it)
    total = torch.tensor(float(sum(p.numel() for p in params if counted(p, tp_rank))), dtype=torch.float64,
                         device=params[0].device)
    all_reduce_over(total, model_parallel_group)
    return int(total.item())


def global_grad_norm(params, tp_rank: int, model_parallel_group) -> torch.Tensor:
    """Of data-parallel-reduced gradients (every DP rank holds them whole, as without ZeRO)."""
    return grouped_sq_norms([params], lambda p: p.grad, tp_rank, [model_parallel_group],
                            params[0].device)[0].sqrt()


class GlobalNormAdamW(torch.optim.AdamW):
    """AdamW that first clips by :func:`global_grad_norm` and keeps the pre-clip norm in
    ``_global_grad_norm``, where DeepSpeed's engine looks for it. A non-finite norm drops the update
    and sets ``overflow``, as DeepSpeed's own optimizers do (the engine then counts a skipped step)."""

    def __init__(self, params, *, max_norm: float, tp_rank: int, model_parallel_group, **kwargs):
        super().__init__(params, **kwargs)
        self.max_norm, self.tp_rank, self.group = max_norm, tp_rank, model_parallel_group
        self._global_grad_norm = None
        self.overflow = False

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"]]
        self._global_grad_norm = float(global_grad_norm(params, self.tp_rank, self.group))
        self.overflow = not math.isfinite(self._global_grad_norm)
        if self.overflow:
            self.zero_grad(set_to_none=True)
            return None
        if self.max_norm > 0:
            coef = min(1.0, self.max_norm / (self._global_grad_norm + 1e-6))  # DeepSpeed's formula
            if coef < 1.0:
                torch._foreach_mul_([p.grad for p in params if p.grad is not None], coef)
        return super().step(closure)
