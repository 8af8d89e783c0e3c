"""Resume a ZeRO-1 checkpoint on another number of data-parallel ranks.

DeepSpeed refuses to load ZeRO optimizer shards saved by another dp size
(without converting to a universal checkpoint). The shards are simple for
ZeRO-1/2, though: per parameter group, each dp rank holds one contiguous,
equal slice of the flat fp32 master weights and of Adam's two moments, with
padding only at the end of the last slice. So the saved slices are joined,
stripped of that padding, and cut again for the current dp size. The engine
itself loads everything else (weights, step, LR schedule, client state) with
``load_optimizer_states=False``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from prores.errors import UsageError


def _saved_shards(engine, root: Path, tag: str, saved_dp: int) -> list[dict]:
    names = [engine._get_rank_zero_ckpt_name(str(root), tag, engine.checkpoint_mp_rank, d, engine.bfloat16_enabled())
             for d in range(saved_dp)]
    return [torch.load(n, map_location="cpu", weights_only=False)["optimizer_state_dict"] for n in names]


def load_with_other_dp(engine, root: Path, tag: str, saved_dp: int) -> tuple[str, dict]:
    """``engine.load_checkpoint`` for a checkpoint written with ``saved_dp`` data-parallel ranks."""
    if not engine.zero_optimization():
        if engine.bfloat16_enabled():
            raise UsageError("resuming with another dp needs parallel.zero_stage=1 when train.precision=bf16;"
                             " resume with the dp the checkpoint was written with.")
        return engine.load_checkpoint(str(root), tag=tag)  # the whole optimizer state is in every mp file
    path, client = engine.load_checkpoint(str(root), tag=tag, load_optimizer_states=False)
    if path is None:
        return path, client
    opt = engine.optimizer
    shards = _saved_shards(engine, root, tag, saved_dp)
    if any(s.get("param_alignment_paddings") != opt.round_robin_bit16_padding for s in shards):
        raise UsageError("the checkpoint's ZeRO parameter alignment differs from this run's; resume with the dp"
                         " it was written with.")
    rank = dist.get_rank(group=opt.dp_process_group)
    for g, mine in enumerate(opt.single_partition_of_fp32_groups):
        n = mine.numel()

        def cut(part_of) -> torch.Tensor:
            flat = torch.cat([part_of(s) for s in shards])
            flat = flat[: flat.numel() - shards[-1]["group_paddings"][g]]
            out = torch.zeros(n, dtype=flat.dtype)
            piece = flat[rank * n: (rank + 1) * n]
            out[: piece.numel()] = piece
            return out.to(mine.device)

        mine.data.copy_(cut(lambda s: s["single_partition_of_fp32_groups"][g]))
        state = opt.optimizer.state[mine]
        for key in ("exp_avg", "exp_avg_sq"):
            state[key] = cut(lambda s: s["base_optimizer_state"]["state"][g][key])
        state["step"] = shards[0]["base_optimizer_state"]["state"][g]["step"].clone()
    if engine.lr_scheduler is not None:  # the optimizer's param groups were not loaded: their lr is stale
        for group, lr in zip(opt.param_groups, engine.lr_scheduler.get_last_lr()):
            group["lr"] = lr
    return path, client
