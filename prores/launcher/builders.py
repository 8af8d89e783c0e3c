"""The parts of one run, each built by one function of the config (and the topology where it matters).

:class:`prores.launcher.train.Trainer` is these calls in order (the callbacks come from
:func:`prores.monitor.registry.build_callbacks`); ``prores analyze`` and the tests build single parts
with them. Every part is built once per process: the ProRes schedule in particular is one
object, shared by the blocks and the scheduler that sets their alpha.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from megatron.core import parallel_state

from prores.data.sources import RunData, build_run_data
from prores.model import fused
from prores.model.block import Block
from prores.model.gpt import Embedding, FinalNorm, Piece, gpt_pieces, lm_loss
from prores.model.init import embedding_std
from prores.model.prores import ProRes, ProResScheduler
from prores.parallel import topology
from prores.parallel.grad_norm import GlobalNormAdamW
from prores.parallel.pipeline import build_pipeline
from prores.parallel.plan import blocks_per_stage
from prores.run import rng
from prores.run.lr import LR_SCHEDULES

def start_processes(cfg) -> topology.Topology:
    """The process group, Megatron's and DeepSpeed's views of it, and this rank's random streams (the
    dropout masks'; :mod:`prores.run.rng`)."""
    topo = topology.init(cfg.parallel.tp, cfg.parallel.pp)
    rng.seed_streams(cfg.train.seed, topo.pp_rank, topo.dp_rank)
    return topo


def resolve_precision(cfg, device: torch.device) -> tuple:
    """(cfg with a concrete ``train.precision``, why): ``auto`` is bf16 where the GPU computes in it (as
    torchtitan's default), else fp32. On CUDA fp32 matmuls use TF32, as Megatron-LM's and torchtitan's do."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    requested = cfg.train.precision
    if requested != "auto":
        return cfg, "requested"
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    why = ("a CUDA device with bf16; fp32 master weights" if bf16 else
           "a CUDA device without bf16; TF32 matmuls" if device.type == "cuda" else "on CPU")
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision="bf16" if bf16 else "fp32")), why


def build_data(cfg, run_dir: Path, tokenizer, dp_rank: int = 0, dp: int = 1) -> RunData:
    """The run's batches for one data-parallel rank; dataset caches (and the preprocessed raw corpus) live
    in ``run_dir/cache``."""
    return build_run_data(cfg.data, tokenizer, seq_length=cfg.model.seq_length,
                          micro_batch_size=cfg.train.micro_batch_size,
                          train_samples=cfg.train.steps * cfg.train.global_batch(dp), seed=cfg.train.seed,
                          cache_dir=Path(run_dir) / "cache", dp_rank=dp_rank, dp_size=dp)


def prores_schedule(cfg) -> ProRes:
    return ProRes(cfg.prores.schedule, cfg.prores.T, cfg.model.num_layers)


def model_pieces(cfg, vocab_size: int, prores: ProRes, backend: str = "eager",
                 tp: tuple[int, int] = (0, 1)) -> list[Piece]:
    """The model as an ordered list of pieces (embedding, blocks, final norm, head) that a pipeline stage,
    or one process, builds."""
    return gpt_pieces(cfg.model, prores, vocab_size, cfg.train.seed, backend, tp)


@dataclass
class Model:
    module: torch.nn.Module  # this stage's pieces, a DeepSpeed PipelineModule
    blocks: dict[int, Block]  # this stage's blocks by global layer number
    prores: ProResScheduler
    backend: str  # the resolved kernels.backend ...
    backend_reason: str  # ... and why


def build_model(cfg, topo, vocab_size: int, device: torch.device) -> Model:
    backend, why = fused.resolve_backend(cfg.kernels.backend, device)
    prores = prores_schedule(cfg)
    pieces = model_pieces(cfg, vocab_size, prores, backend, (topo.tp_rank, topo.tp))
    module = build_pipeline(pieces, lm_loss, topo, is_block=lambda p: p.cls is Block,
                            blocks_per_stage=blocks_per_stage(cfg, vocab_size),
                            recompute=[Block.__name__] if cfg.model.recompute == "block" else [])
    blocks = {b.layer_number: b for b in module.modules() if isinstance(b, Block)}
    return Model(module, blocks, ProResScheduler(prores, blocks), backend, why)


def clips_itself(cfg) -> bool:
    """ZeRO-0 fp32: DeepSpeed's clip there misses parameters (see prores.parallel.grad_norm)."""
    return cfg.parallel.zero_stage == 0 and cfg.train.precision == "fp32"


def one_replica(dp: int) -> bool:
    """One data-parallel replica: ZeRO has nothing to reduce, and prores drops its bookkeeping for a reduction
    (ONE_REPLICA_ZERO, :func:`hand_gradients_to_zero`). The arithmetic is the same, bit for bit."""
    return dp == 1


# No copy of each gradient into a contiguous reduction bucket (and no bucket-sized buffer): the copies cost a
# 48-block step of the study several percent (overhead.py). Not overlap_comm: its hooks would take a pipeline's
# tied gradients before the stages sum them, once a bucket fills during the backward.
ONE_REPLICA_ZERO = {"contiguous_gradients": False}


def hand_gradients_to_zero(engine) -> None:
    """The pipeline's ReduceGrads instruction for ZeRO-1 with one replica. DeepSpeed's flattens every gradient
    into one buffer, divides it by 1, all-reduces it over the one rank and copies it back (2% of a 120-block step
    of the study, overhead.py); this one only runs ZeRO's epilogue, which hands the optimizer its gradients."""
    engine.optimizer.set_gradient_accumulation_boundary(True)
    engine.optimizer.overlapping_partition_gradients_reduce_epilogue()


def deepspeed_config(cfg, dp: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": cfg.train.micro_batch_size,
        "gradient_accumulation_steps": cfg.train.accumulation(dp),
        "gradient_clipping": 0.0 if clips_itself(cfg) else cfg.optim.clip_grad,
        "zero_optimization": {"stage": cfg.parallel.zero_stage, **(ONE_REPLICA_ZERO if one_replica(dp) else {})},
        "bf16": {"enabled": cfg.train.precision == "bf16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def decays(module: torch.nn.Module, rule: str) -> set[int]:
    """The ids of the parameters that decay under ``optim.decay``: ``matrices``, every matrix; ``reference``
    (the ProRes paper's torchrun_main.py: no decay on names with "bias", "layernorm.weight" or "embed_tokens",
    so its final norm's gain decays), every matrix but the token embedding, and the final norm's gain.
    A method's own gains, which the reference has none of, never decay."""
    matrices = {id(p) for p in module.parameters() if p.dim() >= 2}
    if rule == "matrices":
        return matrices
    embedding = {id(m.word_embeddings.weight) for m in module.modules() if isinstance(m, Embedding)}
    final_gain = {id(m.norm.weight) for m in module.modules() if isinstance(m, FinalNorm) and m.norm.weight is not None}
    return (matrices - embedding) | final_gain


def param_groups(module: torch.nn.Module, optim) -> list[dict]:
    """AdamW's parameter groups: those :func:`decays` names decay, the others do not; a block's parameters
    take the learning-rate and epsilon factors its residual method sets (depth-µP,
    ``Block.optimizer_scales``). Each group keeps its factor as ``lr_scale``: a resume sets its
    learning rate from the config again (:meth:`prores.launcher.train.Trainer.load`)."""
    scales = {id(p): b.optimizer_scales for b in module.modules() if isinstance(b, Block) for p in b.parameters()}
    decaying = decays(module, optim.decay)
    groups: dict[tuple, list] = {}
    for p in module.parameters():
        groups.setdefault((id(p) in decaying, *scales.get(id(p), (1.0, 1.0))), []).append(p)
    return [{"params": params, "weight_decay": optim.weight_decay if decay else 0.0, "lr": optim.lr * lr_scale,
             "lr_scale": lr_scale, "eps": optim.eps * eps_scale}
            for (decay, lr_scale, eps_scale), params in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1:]))]


def adamw_kernel(optim) -> dict:
    """torch.optim.AdamW's kernel arguments for ``optim.implementation`` (auto: none, torch's own pick)."""
    return {} if optim.implementation == "auto" else {optim.implementation: True}


def build_optimizer(cfg, module: torch.nn.Module, topo) -> torch.optim.Optimizer:
    """AdamW with the paper's defaults; clipping is DeepSpeed's except where prores must do it."""
    o = cfg.optim
    groups = param_groups(module, o)
    adamw = dict(lr=o.lr, betas=tuple(o.betas), eps=o.eps, **adamw_kernel(o))
    if clips_itself(cfg):
        return GlobalNormAdamW(groups, max_norm=o.clip_grad, tp_rank=topo.tp_rank,
                               model_parallel_group=parallel_state.get_model_parallel_group(), **adamw)
    return torch.optim.AdamW(groups, **adamw)


def setup_text(cfg, module: torch.nn.Module) -> str:
    """The start-up line that says the training setup's choices where the ProRes paper's code differs."""
    o, decaying = cfg.optim, decays(module, cfg.optim.decay)
    decayed = sum(1 for p in module.parameters() if id(p) in decaying)
    return (f"setup: token embedding init std {embedding_std(cfg.model):.4g} (model.embedding_init="
            f"{cfg.model.embedding_init}); weight decay {o.weight_decay:g} on {decayed} of"
            f" {sum(1 for _ in module.parameters())} parameter tensors (optim.decay={o.decay}); the first update at"
            f" {lr_lambda(cfg)(0):.4g}·lr (optim.lr_convention={o.lr_convention})")


def lr_lambda(cfg):
    """The multiplier of ``step`` (0-based, the update about to be made). ``optim.lr_convention=reference``
    evaluates the schedule one step behind, which is what the reference's ``LambdaLR(step / warmup)`` gives:
    its warmup starts at 0 and its linear decay ends at 1/decay_steps, where prores's reach the same values one
    update earlier."""
    fn, o = LR_SCHEDULES[cfg.optim.lr_schedule], cfg.optim
    behind = 1 if o.lr_convention == "reference" else 0
    return lambda step: fn(step - behind, cfg.train.steps, o.warmup_steps, o.min_lr_ratio, o.decay_fraction)


def build_engine(cfg, module: torch.nn.Module, topo):
    """The optimizer, its learning-rate schedule and DeepSpeed's pipeline engine around ``module``."""
    import deepspeed
    from deepspeed.runtime.pipe.schedule import ReduceGrads
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    optimizer = build_optimizer(cfg, module, topo)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=deepspeed_config(cfg, topo.dp))
    if one_replica(topo.dp) and isinstance(engine.optimizer, DeepSpeedZeroOptimizer):
        # the engine looks its instructions up on itself: this one's ReduceGrads, the class's others (only ZeRO-1/2's
        # optimizer has the epilogue it calls; tests/test_train.py checks that it is the one that runs)
        engine._INSTRUCTION_MAP = {**engine._INSTRUCTION_MAP, ReduceGrads: hand_gradients_to_zero}
    return engine
