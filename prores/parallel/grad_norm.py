"""The true global gradient norm of a TP × PP model, and an AdamW that clips by it.

Each parameter counts once: tensor-parallel shards on every TP rank,
TP-replicated parameters (norm gains) on TP rank 0 only, DeepSpeed's tied
copies (``ds_pipe_replicated``) only on their owning stage; the squares are
summed over all stages and TP ranks of one data-parallel replica.

DeepSpeed's ZeRO-1 optimizer gets this right. Its ZeRO-0 fp32 path does not:
``deepspeed.runtime.utils.clip_grad_norm_`` counts replicated parameters only
where the pipe×tensor "model parallel rank" is 0, i.e. on the first stage, and
it reports no norm. :class:`GlobalNormAdamW` is used there instead.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from prores.parallel.sharding import is_sharded


def global_grad_norm(params, tp_rank: int, model_parallel_group) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None and (is_sharded(p) or tp_rank == 0)
             and not getattr(p, "ds_pipe_replicated", False)]
    sq = torch.stack([g.detach().float().square().sum() for g in grads]).sum() if grads else torch.zeros(())
    dist.all_reduce(sq, group=model_parallel_group)
    return sq.sqrt()


class GlobalNormAdamW(torch.optim.AdamW):
    """AdamW that first clips by :func:`global_grad_norm` and keeps the pre-clip norm in
    ``_global_grad_norm``, where DeepSpeed's engine looks for it."""

    def __init__(self, params, *, max_norm: float, tp_rank: int, model_parallel_group, **kwargs):
        super().__init__(params, **kwargs)
        self.max_norm, self.tp_rank, self.group = max_norm, tp_rank, model_parallel_group
        self._global_grad_norm = None

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"]]
        norm = global_grad_norm(params, self.tp_rank, self.group)
        self._global_grad_norm = float(norm)
        if self.max_norm > 0:
            coef = min(1.0, self.max_norm / (self._global_grad_norm + 1e-6))  # DeepSpeed's formula
            if coef < 1.0:
                torch._foreach_mul_([p.grad for p in params if p.grad is not None], coef)
        return super().step(closure)
