"""Resume a ZeRO-1 pipeline checkpoint on another tp × pp × dp.

DeepSpeed loads a pipeline checkpoint only onto the tp and pp that wrote it (its universal checkpoint
needs an offline conversion of the whole model first). But a ZeRO-1 checkpoint already holds everything
a new layout needs, by name: each model-parallel rank's optimizer shards are flat fp32 vectors per
parameter group (the master weights and Adam's two moments), cut over the data-parallel ranks, and its
``mp_rank_XX_model_states.pt`` lists the parameters in that flat order (``param_shapes``, written for
DeepSpeed's own ``zero_to_fp32``) under names that are the same on every layout: a pipeline piece is
named by its global index, a tied piece by its key.

So each rank of the new layout reads the saved shards of the (stage, tp rank) pairs that hold its
parameters, one pair at a time, takes out those parameters, glues each one's tp shards whole and cuts
this rank's tp shard (:mod:`prores.model.sharding`, from Megatron's partition attributes), then lays
them out in its own optimizer's flat order and keeps its own data-parallel slice. Nothing ever holds
more than one saved stage's shards and this rank's own parameters. The module's weights are the fp32
masters cast to the module's dtype, which is what ZeRO's step writes into them.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

from prores.model.sharding import shard, unshard

MOMENTS = ("exp_avg", "exp_avg_sq")


def mp_rank(stage: int, tp_rank: int, tp: int, pp: int) -> int:
    """The ``mp_rank_XX`` of a (stage, tp rank) in DeepSpeed's file names: its position among the ranks of
    one data-parallel index, whose axes are (pipe, data, model)."""
    topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=1)
    return sorted(topo.get_axis_list(axis="data", idx=0)).index(topo.get_rank(pipe=stage, data=0, model=tp_rank))


def zero_file(tag_dir: Path, dp_rank: int, mp: int) -> Path:
    """A ZeRO optimizer shard's file (DeepSpeed prefixes ``bf16_`` to those of a bf16 run)."""
    name = f"zero_pp_rank_{dp_rank}_mp_rank_{mp:02d}_optim_states.pt"
    return next((p for p in (tag_dir / f"bf16_{name}", tag_dir / name) if p.is_file()), tag_dir / name)


def model_states(tag_dir: Path, mp: int) -> dict:
    return torch.load(tag_dir / f"mp_rank_{mp:02d}_model_states.pt", map_location="cpu", weights_only=False)


def _saved_pieces(tag_dir: Path, mp: int, shapes: list[dict], dp: int,
                  wanted: set[str]) -> tuple[dict[str, dict], torch.Tensor]:
    """``{name: {"fp32": t, "exp_avg": t, "exp_avg_sq": t}}`` of the wanted parameters that model-parallel
    rank ``mp`` held (as it held them: its tp shard; ``shapes``: its model states' ``param_shapes``), and its
    Adam step."""
    if not wanted & {name for group in shapes for name in group}:
        return {}, None
    shards = [torch.load(zero_file(tag_dir, d, mp), map_location="cpu", weights_only=False)["optimizer_state_dict"]
              for d in range(dp)]
    found: dict[str, dict] = {}
    for g, group in enumerate(shapes):
        flats = {"fp32": torch.cat([s["single_partition_of_fp32_groups"][g] for s in shards])}
        for key in MOMENTS:
            flats[key] = torch.cat([s["base_optimizer_state"]["state"][g][key] for s in shards])
        paddings = shards[0]["param_alignment_paddings"][g]
        offset = 0
        for (name, size), padding in zip(group.items(), paddings):
            n = size.numel()
            if name in wanted:
                found[name] = {key: flat[offset:offset + n].view(size).clone() for key, flat in flats.items()}
            offset += n + padding
    return found, shards[0]["base_optimizer_state"]["state"][0]["step"].clone()


def load_on_other_layout(engine, tag_dir: Path, saved: dict, tp_rank: int, tp: int) -> dict:
    """Weights, Adam state, step and learning-rate schedule of the checkpoint in ``tag_dir``, written on
    ``saved`` = ``{"tp", "pp", "dp"}``, onto ``engine`` (ZeRO-1) on this layout; returns the checkpoint's
    client state, as ``engine.load_checkpoint`` does."""
    opt = engine.optimizer
    mine = {engine.param_names[p]: p for group in opt.round_robin_bit16_groups for p in group}
    pieces: dict[str, list] = {name: [None] * saved["tp"] for name in mine}
    step, states = None, model_states(tag_dir, 0)  # mp rank 0's also holds the engine's counters, read below
    for stage in range(saved["pp"]):
        for r in range(saved["tp"]):
            wanted = {name for name, shards in pieces.items() if shards[r] is None}
            mp = mp_rank(stage, r, saved["tp"], saved["pp"])
            shapes = (states if mp == 0 else model_states(tag_dir, mp))["param_shapes"]
            found, stage_step = _saved_pieces(tag_dir, mp, shapes, saved["dp"], wanted)
            for name, values in found.items():  # a tied parameter is on two stages, identical: the first wins
                pieces[name][r] = values
            step = stage_step if stage_step is not None else step
    missing = sorted(name for name, shards in pieces.items() if any(s is None for s in shards))
    if missing:
        raise RuntimeError(f"checkpoint {tag_dir} has no saved state for {', '.join(missing[:5])}")

    def resharded(name: str, key: str) -> torch.Tensor:
        return shard(unshard([s[key] for s in pieces[name]], mine[name]), mine[name], tp_rank, tp)

    rank = dist.get_rank(group=opt.dp_process_group)
    for g, group in enumerate(opt.round_robin_bit16_groups):
        partition = opt.single_partition_of_fp32_groups[g]
        n = partition.numel()
        flats = {}
        for key in ("fp32", *MOMENTS):
            parts = []
            for param, padding in zip(group, opt.round_robin_bit16_padding[g]):
                value = resharded(engine.param_names[param], key)
                parts += [value.flatten(), torch.zeros(padding)]
                if key == "fp32":
                    param.data.copy_(value.to(param.dtype))
            flat = torch.cat(parts)
            flats[key] = torch.cat([flat, torch.zeros(opt.bit16_groups_flat[g].numel() - flat.numel())])
        partition.data.copy_(flats["fp32"][rank * n:(rank + 1) * n])
        opt.optimizer.state[partition] = {"step": step.clone(), **{
            key: flats[key][rank * n:(rank + 1) * n].clone().to(partition.device) for key in MOMENTS}}
    engine.global_steps, engine.global_samples = states["global_steps"], states["global_samples"]
    engine.skipped_steps = states["skipped_steps"]
    schedule = engine.lr_scheduler
    schedule.last_epoch, schedule._step_count = states["lr_scheduler"]["last_epoch"], states["lr_scheduler"]["_step_count"]
    return states
