"""The training loop: the model's pieces in a DeepSpeed pipeline engine, driven step by step.

TensorBoard step convention: everything logged at step t was computed by the
model after t completed optimizer steps, with alpha(l, t). So ``train/*`` at
step t describe the update that takes the model from t to t+1 (its loss,
pre-clip grad norm and learning rate), and ``prores/alpha/*`` at step t is the
alpha that update used. ``valid/*`` at step t evaluates the model after t
updates.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path
from typing import Optional

import torch
from megatron.core import parallel_state

from prores.config import Config, dump_config
from prores.errors import UsageError
from prores.data.sources import build_run_data
from prores.data.tokenizers import load_tokenizer
from prores.launcher.checkpoint import Checkpoints, Found, tag_of
from prores.launcher.lr import LR_SCHEDULES
from prores.launcher.preflight import clean_up_failed_start, preflight
from prores.launcher.progress import Progress
from prores.launcher.slurm import StopSignals, requeue
from prores.launcher.summary import SUMMARY, Summary
from prores.model import fused
from prores.model.block import Block
from prores.model.gpt import gpt_pieces, lm_loss
from prores.model.prores import ProRes
from prores.monitor.stats import LayerStats
from prores.monitor.tensorboard import RunWriter, mark_resume
from prores.parallel import topology as topo_mod
from prores.parallel.grad_norm import GlobalNormAdamW
from prores.parallel.pipeline import build_pipeline, uniform_blocks
from prores.parallel.zero_reshard import load_with_other_dp


def clips_itself(cfg: Config) -> bool:
    """ZeRO-0 fp32: DeepSpeed's clip there misses parameters (see prores.parallel.grad_norm)."""
    return cfg.parallel.zero_stage == 0 and cfg.train.precision == "fp32"


def deepspeed_config(cfg: Config) -> dict:
    return {
        "train_micro_batch_size_per_gpu": cfg.train.micro_batch_size,
        "gradient_accumulation_steps": cfg.train.grad_accum,
        "gradient_clipping": 0.0 if clips_itself(cfg) else cfg.optim.clip_grad,
        "zero_optimization": {"stage": cfg.parallel.zero_stage},
        "bf16": {"enabled": cfg.train.precision == "bf16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def param_groups(module: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only; norm gains and biases are vectors and are not decayed."""
    decay = [p for p in module.parameters() if p.dim() >= 2]
    other = [p for p in module.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]


def build_optimizer(cfg: Config, module: torch.nn.Module, topo) -> torch.optim.Optimizer:
    """AdamW with the paper's defaults; clipping is DeepSpeed's except where prores must do it."""
    o = cfg.optim
    groups, adamw = param_groups(module, o.weight_decay), dict(lr=o.lr, betas=tuple(o.betas), eps=o.eps)
    if clips_itself(cfg):
        return GlobalNormAdamW(groups, max_norm=o.clip_grad, tp_rank=topo.tp_rank,
                               model_parallel_group=parallel_state.get_model_parallel_group(), **adamw)
    return torch.optim.AdamW(groups, **adamw)


def lr_lambda(cfg: Config):
    fn, o = LR_SCHEDULES[cfg.optim.lr_schedule], cfg.optim
    return lambda step: fn(step, cfg.train.steps, o.warmup_steps, o.min_lr_ratio, o.decay_fraction)


def global_batch(cfg: Config, dp: int) -> int:
    return cfg.train.micro_batch_size * cfg.train.grad_accum * dp


def run_data(cfg: Config, run_dir: Path, tokenizer, dp_rank: int = 0, dp: int = 1):
    """The run's batches; dataset caches (and the preprocessed raw corpus) live in run_dir/cache."""
    return build_run_data(cfg.data, tokenizer, seq_length=cfg.model.seq_length,
                          micro_batch_size=cfg.train.micro_batch_size,
                          train_samples=cfg.train.steps * global_batch(cfg, dp), seed=cfg.train.seed,
                          cache_dir=run_dir / "cache", dp_rank=dp_rank, dp_size=dp)


class Trainer:
    """Builds everything for one run directory; resumes from its newest good checkpoint unless told not to.

    ``overwrite`` (with ``resume=False``): the run directory's checkpoints, events and summary are deleted
    first.
    """

    def __init__(self, cfg: Config, run_dir: Path, resume: bool = True, overwrite: bool = False):
        import deepspeed

        self.cfg, self.run_dir = cfg, run_dir
        self.topo = topo_mod.init(cfg.parallel.tp, cfg.parallel.pp)
        torch.manual_seed(cfg.train.seed)  # dropout masks; weights are seeded per parameter
        self.checkpoints = Checkpoints(run_dir, cfg.checkpoint.keep_last, cfg.checkpoint.keep_every)
        if overwrite and not resume:
            self.checkpoints.remove_all()
            if self.topo.rank == 0:
                for old in [*run_dir.glob("events.out.tfevents.*"), run_dir / SUMMARY]:
                    old.unlink(missing_ok=True)
        found = self.checkpoints.newest_good(self.say) if resume else None  # preflight checked it fits

        tokenizer = load_tokenizer(cfg.data.tokenizer)
        self.data = run_data(cfg, run_dir, tokenizer, self.topo.dp_rank, self.topo.dp)

        m = cfg.model
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.backend, why = fused.resolve_backend(cfg.kernels.backend, device)
        if self.topo.rank == 0:
            print(f"kernels.backend={cfg.kernels.backend}: using {self.backend} ({why})")
        self.prores = ProRes(cfg.prores.schedule, cfg.prores.T, m.num_layers)
        pieces = gpt_pieces(m, self.prores, tokenizer.vocab_size, cfg.train.seed, self.backend)
        module = build_pipeline(pieces, lm_loss, self.topo, is_block=lambda p: p.cls is Block,
                                blocks_per_stage=cfg.parallel.stage_layers
                                or uniform_blocks(m.num_layers, cfg.parallel.pp))
        self.blocks = {b.layer_number: b for b in module.modules() if isinstance(b, Block)}
        optimizer = build_optimizer(cfg, module, self.topo)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
        self.engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler,
                                                    config=deepspeed_config(cfg))
        self.device = device
        self.tokens_per_step = global_batch(cfg, self.topo.dp) * cfg.model.seq_length
        if found is not None:
            self.load(found)
            if self.topo.rank == 0:
                mark_resume(run_dir, self.step)
            torch.distributed.barrier()
            time.sleep(1.05)  # see mark_resume: the writers' files must sort after the marker
        self.writer = RunWriter(run_dir, self.topo.rank, self.topo.is_loss_writer, self.topo.is_stage_writer)
        self.stats = LayerStats(self.blocks)

    def say(self, message: str) -> None:
        if self.topo.rank == 0:
            print(message, flush=True)

    def load(self, found: Found) -> None:
        saved_dp, root, tag = found.manifest["parallel"]["dp"], self.checkpoints.root, found.path.name
        if saved_dp == self.topo.dp:
            path, client = self.engine.load_checkpoint(str(root), tag=tag)
        else:
            path, client = load_with_other_dp(self.engine, root, tag, saved_dp)
        if path is None:
            raise UsageError(f"DeepSpeed could not load checkpoint {found.path}; start a new --run-dir.")
        self.data.train.load_state_dict(client["data"])
        same_world = self.checkpoints.load_rng(found)
        self.say(f"resuming from step {self.step}: {found.path}"
                 + ("" if same_world else f" (dp {saved_dp} -> {self.topo.dp}; RNG streams start afresh)"))

    @property
    def step(self) -> int:
        return self.engine.global_steps

    def set_alpha(self, step: int) -> dict[int, float]:
        for block in self.blocks.values():
            block.set_step(step)
        return {l: self.prores.alpha(l, step) for l in self.blocks}

    def train_step(self) -> dict[str, float]:
        t = self.step
        alphas = self.set_alpha(t)
        lr = self.engine.get_lr()[0]
        collect_stats = t % self.cfg.logging.stats_interval == 0
        self.stats.active = collect_stats
        start = time.perf_counter()
        loss = float(self.engine.train_batch(self.data.train))
        elapsed = time.perf_counter() - start
        self.stats.active = False
        grad_norm = self.engine.get_global_grad_norm()
        metrics = {"train/loss": loss, "train/lr": lr, "train/tokens_per_sec": self.tokens_per_step / elapsed,
                   "train/samples": float(self.data.train.consumed)}
        if grad_norm is not None:
            metrics["train/grad_norm"] = float(grad_norm)
        if t % self.cfg.train.log_interval == 0 or t == self.cfg.train.steps - 1:
            self.writer.loss_scalars(metrics, t)
            self.writer.layer_scalars("prores/alpha", alphas, t)
        if collect_stats:
            self.writer.layer_scalars("layers/act_rms", self.stats.collect(), t)
        return metrics

    def evaluate(self) -> float:
        """Mean loss on the validation split and on every eval set; returns the validation loss."""
        t = self.step
        self.set_alpha(t)
        metrics = {}
        for tag, batches in [("valid", self.data.valid)] + [(f"eval/{n}", b) for n, b in self.data.evals.items()]:
            losses = [float(self.engine.eval_batch(iter([batch]), num_micro_batches=1)) for batch in batches]
            loss = sum(losses) / len(losses)
            metrics.update({f"{tag}/loss": loss, f"{tag}/ppl": math.exp(min(loss, 50.0))})
        self.writer.loss_scalars(metrics, t)
        return metrics["valid/loss"]

    def save(self) -> Path:
        t = self.topo
        return self.checkpoints.save(
            self.engine, self.step, client_state={"data": self.data.train.state_dict(), "config": self.cfg.to_dict()},
            meta={"world_size": t.world_size, "parallel": {"tp": t.tp, "pp": t.pp, "dp": t.dp},
                  "config": self.cfg.to_dict()})

    def fit(self) -> Summary:
        """Train to ``train.steps``, or until a stop signal: then save, requeue under Slurm, and return."""
        cfg = self.cfg
        progress = Progress(cfg.train.steps, self.step, cfg.train.log_interval,
                            bar=cfg.logging.progress_bar and self.topo.is_loss_writer,
                            quiet=not self.topo.is_loss_writer)
        valid_loss, step_rates, stopped = float("nan"), [], False
        if self.step and (self.step % cfg.train.eval_interval == 0 or self.step >= cfg.train.steps):
            valid_loss = self.evaluate()  # mark_resume dropped the interrupted run's entries at this step
        start = time.perf_counter()
        with StopSignals() as stop:
            while self.step < cfg.train.steps:
                metrics = self.train_step()
                step_rates.append(metrics["train/tokens_per_sec"])
                progress.step(self.step, metrics)
                done = self.step == cfg.train.steps
                if self.step % cfg.train.eval_interval == 0 or done:
                    valid_loss = self.evaluate()
                    progress.write(f"step {self.step}: valid loss {valid_loss:.4f}"
                                   f" (unigram entropy {self.data.unigram_entropy:.4f})")
                interval = cfg.checkpoint.interval
                saved = done or (interval and self.step % interval == 0)
                if saved:
                    self.save()
                if not done and stop.agreed(self.device):
                    self.say(f"stop signal ({stop.received}): stopping after step {self.step}")
                    path = self.checkpoints.root / tag_of(self.step) if saved else self.save()
                    self.say(f"checkpoint {path} saved")
                    if self.topo.rank == 0:
                        self.say(requeue())
                    stopped = True
                    break
        wall = time.perf_counter() - start
        progress.close()
        self.writer.close()
        trained = len(step_rates)
        return Summary(steps=self.step, final_valid_loss=valid_loss, unigram_entropy=self.data.unigram_entropy,
                       tokens_per_sec=trained * self.tokens_per_step / wall if trained else None,
                       steady_tokens_per_sec=statistics.median(step_rates[trained // 2:]) if trained else None,
                       train_seconds=wall, stopped=stopped)


def _rate(tokens_per_sec: Optional[float]) -> str:
    return "n/a" if tokens_per_sec is None else f"{tokens_per_sec:.0f}"


def train(cfg: Config, run_dir: Path, resume: bool = True, overwrite: bool = False) -> Optional[Summary]:
    """One run in ``run_dir``; None when the run was finished already (nothing is touched then)."""
    created = not run_dir.exists()
    try:
        plan = preflight(cfg, run_dir, resume, overwrite)
    except UsageError:
        clean_up_failed_start(run_dir, created, int(os.environ.get("WORLD_SIZE", "1")))
        raise
    if plan.finished:
        if plan.rank == 0:
            print(f"run directory {run_dir} is finished (step {plan.newest.step}, train.steps={cfg.train.steps});"
                  " its summary.json is left as it was. To train further, raise train.steps.")
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    if plan.rank == 0:
        print(f"run directory {run_dir}", flush=True)
    trainer = Trainer(cfg, run_dir, resume=resume, overwrite=overwrite)
    if trainer.topo.rank == 0:
        dump_config(cfg, run_dir / "config.yaml")
    summary = trainer.fit()
    if trainer.topo.is_loss_writer and not summary.stopped:
        summary.write(run_dir)
        print(f"final valid loss {summary.final_valid_loss:.4f} nats/token"
              f" vs unigram entropy {summary.unigram_entropy:.4f} nats/token"
              f" ({_rate(summary.tokens_per_sec)} tokens/s over the run,"
              f" {_rate(summary.steady_tokens_per_sec)} in the steady state)")
    return summary
