"""A process of test_state's: ``state_dump.py RUN_DIR OUT KEY=VALUE...`` (alone or under torchrun) resumes the run
directory's newest checkpoint on this launch's layout, as `prores train` would, and writes what every rank then
holds to ``OUT/rank{R}.pt``, before any step: each of its parameters' fp32 master and Adam moments whole over dp
(DeepSpeed's own addressing of its ZeRO partitions, ``safe_get_full_*``: nothing of prores's resharding), with
Megatron's partition attributes to glue tp shards; the step counters, the learning-rate schedule, the data
position, the ProRes state and the RNG states."""

import sys
from pathlib import Path

import torch
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

from prores.config import load_config
from prores.launcher.train import Trainer
from prores.run import rng


def dump(run_dir: str, out: str, overrides: list[str]) -> None:
    cfg = load_config(None, tuple(overrides))
    trainer = Trainer(cfg, Path(run_dir))
    engine, topo = trainer.engine, trainer.topo
    opt = engine.optimizer
    opt._lazy_init_hp_params_optimizer_state()  # what the first step would do: DeepSpeed's view of the moments
    params = {}
    for param, name in engine.param_names.items():  # the same order on every rank of a stage (collectives)
        params[name] = {
            "fp32": safe_get_full_fp32_param(param).clone(),
            "exp_avg": safe_get_full_optimizer_state(param, "exp_avg").clone(),
            "exp_avg_sq": safe_get_full_optimizer_state(param, "exp_avg_sq").clone(),
            "module": param.detach().clone(),
            "sharded": bool(getattr(param, "tensor_model_parallel", False)),
            "partition_dim": getattr(param, "partition_dim", -1),
            "partition_stride": getattr(param, "partition_stride", 1),
        }
    schedule = engine.lr_scheduler
    state = {
        "coords": {"tp": topo.tp, "pp": topo.pp, "dp": topo.dp, "tp_rank": topo.tp_rank, "pp_rank": topo.pp_rank,
                   "dp_rank": topo.dp_rank},
        "params": params,
        "counters": {"global_steps": engine.global_steps, "global_samples": engine.global_samples,
                     "skipped_steps": engine.skipped_steps, "last_epoch": schedule.last_epoch,
                     "step_count": schedule._step_count},
        "lrs": [g["lr"] for g in opt.param_groups],
        "adam_steps": [float(opt.optimizer.state[p]["step"]) for p in opt.single_partition_of_fp32_groups],
        "data": trainer.data.train.state_dict(),
        "prores": trainer.prores.state_dict(),
        "rng": rng.states(),
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    torch.save(state, Path(out) / f"rank{topo.rank}.pt")
    torch.distributed.barrier()


if __name__ == "__main__":
    dump(sys.argv[1], sys.argv[2], sys.argv[3:])
