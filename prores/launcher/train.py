"""The training loop: the model's pieces in a DeepSpeed pipeline engine, driven step by step.

:meth:`Trainer.fit` is the plain loop; logging, diagnostics, checkpoint policy,
stop signals and divergence are callbacks (:mod:`prores.launcher.callbacks`).

TensorBoard step convention: everything logged at step t was computed by the
model after t completed optimizer steps, with alpha(l, t). So ``train/*`` at
step t describe the update that takes the model from t to t+1 (its loss,
pre-clip grad norm and learning rate), and ``prores/alpha/*`` at step t is the
alpha that update used. ``valid/*`` at step t evaluates the model after t
updates.
"""

from __future__ import annotations

import hashlib
import math
import os
import statistics
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy
import torch
from megatron.core import parallel_state

from prores.config import Config, config_text, dump_config
from prores.errors import UsageError
from prores.data.sources import build_run_data
from prores.data.tokenizers import load_tokenizer
from prores.launcher.callbacks import (BestValidation, Callback, SaveCheckpoints, ShowProgress, StopOnSignal,
                                      StopWhenNonFinite)
from prores.launcher.checkpoint import Checkpoints, Found
from prores.launcher.lr import LR_SCHEDULES
from prores.launcher.preflight import clean_up_failed_start, preflight
from prores.launcher.summary import SUMMARY, Summary
from prores.model import fused
from prores.model.block import Block
from prores.model.gpt import gpt_pieces, lm_loss
from prores.model.prores import ProRes, ProResScheduler
from prores.monitor.heatmaps import Heatmaps
from prores.monitor.layer_stats import LayerDiagnostics
from prores.monitor.run_scalars import LogScalars
from prores.monitor.spikes import SpikeScores
from prores.monitor.tensorboard import RunWriter, mark_resume
from prores.parallel import topology as topo_mod
from prores.parallel.grad_norm import GlobalNormAdamW, count_parameters
from prores.parallel.pipeline import build_pipeline
from prores.parallel.plan import blocks_per_stage
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


def dropout_seed(seed: int, topo) -> int:
    """The default generator's seed, which draws the dropout masks (weights are seeded per parameter):
    its own stream on every data-parallel rank and pipeline stage, the same on the tensor-parallel ranks
    of a stage, whose hidden dropout acts on the same replicated activations (as in Megatron)."""
    return int(numpy.random.SeedSequence([seed, topo.pp_rank, topo.dp_rank]).generate_state(1)[0])


def run_data(cfg: Config, run_dir: Path, tokenizer, dp_rank: int = 0, dp: int = 1):
    """The run's batches; dataset caches (and the preprocessed raw corpus) live in run_dir/cache."""
    return build_run_data(cfg.data, tokenizer, seq_length=cfg.model.seq_length,
                          micro_batch_size=cfg.train.micro_batch_size,
                          train_samples=cfg.train.steps * cfg.train.global_batch(dp), seed=cfg.train.seed,
                          cache_dir=run_dir / "cache", dp_rank=dp_rank, dp_size=dp)


def default_callbacks(cfg: Config) -> list[Callback]:
    """In order: what logs a step comes before what may veto its checkpoint, which comes before the save."""
    return [LogScalars(), SpikeScores(cfg.monitor.spike_sigma, cfg.monitor.spike_window), LayerDiagnostics(),
            Heatmaps(), ShowProgress(), BestValidation(), StopWhenNonFinite(), SaveCheckpoints(), StopOnSignal()]


class Trainer:
    """Builds everything for one run directory; resumes from its newest good checkpoint unless told not to.

    ``overwrite`` (with ``resume=False``): the run directory's checkpoints, events and summary are deleted
    first.
    """

    def __init__(self, cfg: Config, run_dir: Path, resume: bool = True, overwrite: bool = False,
                 callbacks: Optional[Sequence[Callback]] = None):
        import deepspeed

        self.cfg, self.run_dir = cfg, run_dir
        self.callbacks = list(default_callbacks(cfg) if callbacks is None else callbacks)
        self.stop_status: Optional[str] = None
        self.topo = topo_mod.init(cfg.parallel.tp, cfg.parallel.pp)
        torch.manual_seed(dropout_seed(cfg.train.seed, self.topo))
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
        pieces = gpt_pieces(m, ProRes(cfg.prores.schedule, cfg.prores.T, m.num_layers), tokenizer.vocab_size,
                            cfg.train.seed, self.backend)
        self.module = build_pipeline(pieces, lm_loss, self.topo, is_block=lambda p: p.cls is Block,
                                     blocks_per_stage=blocks_per_stage(cfg, tokenizer.vocab_size),
                                     recompute=[Block.__name__] if m.recompute == "block" else [])
        self.blocks = {b.layer_number: b for b in self.module.modules() if isinstance(b, Block)}
        self.prores = ProResScheduler(ProRes(cfg.prores.schedule, cfg.prores.T, m.num_layers), self.blocks)
        optimizer = build_optimizer(cfg, self.module, self.topo)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
        self.engine, _, _, _ = deepspeed.initialize(model=self.module, optimizer=optimizer, lr_scheduler=scheduler,
                                                    config=deepspeed_config(cfg))
        self._call_before_updates()
        self.device = device
        self.tokens_per_step = cfg.train.global_batch(self.topo.dp) * cfg.model.seq_length
        if found is not None:
            self.load(found)
            if self.topo.rank == 0:
                mark_resume(run_dir, self.step)
            torch.distributed.barrier()
            time.sleep(1.05)  # see mark_resume: the writers' files must sort after the marker
        self.writer = RunWriter(run_dir, self.topo.rank, self.topo.is_loss_writer, self.topo.is_stage_writer)
        self.last_eval: dict[str, float] = {}
        self.parameters = count_parameters(list(self.module.parameters()), self.topo.tp_rank,
                                           parallel_state.get_model_parallel_group())

    def _call_before_updates(self) -> None:
        """DeepSpeed's engine calls ``optimizer.step()`` between its gradient reduction and the update,
        the only moment the reduced, unclipped gradients exist: the ``pre_update`` hooks run there."""
        optimizer = self.engine.optimizer
        step = optimizer.step

        def step_after_hooks(*args, **kwargs):
            self.call("pre_update", self.step)
            return step(*args, **kwargs)

        optimizer.step = step_after_hooks

    def call(self, hook: str, *args) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self, *args)

    def say(self, message: str) -> None:
        if self.topo.rank == 0:
            print(message, flush=True)

    def request_stop(self, status: str, message: str = "") -> None:
        """End the run after this step with ``status`` (``stopped`` or ``diverged``)."""
        self.stop_status = status
        if message:
            self.say(message)

    def log_due(self, step: int) -> bool:
        return step % self.cfg.train.log_interval == 0 or step == self.cfg.train.steps - 1

    def load(self, found: Found) -> None:
        saved_dp, root, tag = found.manifest["parallel"]["dp"], self.checkpoints.root, found.path.name
        if saved_dp == self.topo.dp:
            path, client = self.engine.load_checkpoint(str(root), tag=tag)
        else:
            path, client = load_with_other_dp(self.engine, root, tag, saved_dp)
        if path is None:
            raise UsageError(f"DeepSpeed could not load checkpoint {found.path}; start a new --run-dir.")
        self.data.train.load_state_dict(client["data"])
        self.prores.load_state_dict(client["prores"])
        self._learning_rate_from_config()
        for callback in self.callbacks:
            if callback.name is not None and callback.name in client["callbacks"]:
                callback.load_state_dict(client["callbacks"][callback.name])
        same_world = self.checkpoints.load_rng(found)
        self.say(f"resuming from step {self.step}: {found.path}"
                 + ("" if same_world else f" (dp {saved_dp} -> {self.topo.dp}; RNG streams start afresh)"))

    def _learning_rate_from_config(self) -> None:
        """A resume keeps the optimizer's moments and the schedule's position but takes the peak
        learning rate from this run's config (the checkpoint's would otherwise win silently): so
        ``--set optim.lr=...`` on a resume, e.g. after a spike, takes effect."""
        schedule = self.engine.lr_scheduler
        schedule.base_lrs = [self.cfg.optim.lr] * len(schedule.base_lrs)
        for group, factor in zip(schedule.optimizer.param_groups, schedule.lr_lambdas):
            group["lr"] = self.cfg.optim.lr * factor(schedule.last_epoch)

    @property
    def step(self) -> int:
        return self.engine.global_steps

    def train_step(self) -> dict[str, float]:
        """The update from step t to t+1 (alpha of step t), and what describes it."""
        self.prores.step(self.step)
        lr = self.engine.get_lr()[0]
        start = time.perf_counter()
        loss = float(self.engine.train_batch(self.data.train))
        elapsed = time.perf_counter() - start
        grad_norm = self.engine.get_global_grad_norm()
        metrics = {"train/loss": loss, "train/lr": lr, "train/tokens_per_sec": self.tokens_per_step / elapsed,
                   "train/samples": float(self.data.train.consumed)}
        if grad_norm is not None:
            metrics["train/grad_norm"] = float(grad_norm)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Mean loss on the validation split and on every eval set, of the model after ``step`` updates."""
        self.prores.step(self.step)
        metrics = {}
        for tag, batches in [("valid", self.data.valid)] + [(f"eval/{n}", b) for n, b in self.data.evals.items()]:
            losses = [float(self.engine.eval_batch(iter([batch]), num_micro_batches=1)) for batch in batches]
            loss = sum(losses) / len(losses)
            metrics.update({f"{tag}/loss": loss, f"{tag}/ppl": math.exp(min(loss, 50.0))})
        self.last_eval = metrics
        self.call("post_eval", self.step, metrics)
        return metrics

    def save(self) -> Path:
        t = self.topo
        client = {"data": self.data.train.state_dict(), "prores": self.prores.state_dict(),
                  "callbacks": {c.name: c.state_dict() for c in self.callbacks if c.name is not None},
                  "config": self.cfg.to_dict()}
        path = self.checkpoints.save(self.engine, self.step, client_state=client,
                                     meta={"world_size": t.world_size, "parallel": {"tp": t.tp, "pp": t.pp, "dp": t.dp},
                                           "config": self.cfg.to_dict()})
        self.call("post_checkpoint", self.step, path)
        return path

    def step_once(self) -> dict[str, float]:
        """One pass of the loop's body: the step and its callbacks, and an evaluation when one is due."""
        t = self.step
        self.call("pre_step", t)
        metrics = self.train_step()
        self.call("post_step", t, metrics)
        if self.stop_status is None and (self.step % self.cfg.train.eval_interval == 0
                                         or self.step == self.cfg.train.steps):
            self.evaluate()
        return metrics

    def fit(self) -> Summary:
        """Train to ``train.steps``, or until a callback stops the run."""
        cfg = self.cfg
        self.call("on_start")
        if self.step and (self.step % cfg.train.eval_interval == 0 or self.step >= cfg.train.steps):
            self.evaluate()  # mark_resume dropped the interrupted run's entries at this step
        rates, start = [], time.perf_counter()
        while self.step < cfg.train.steps and self.stop_status is None:
            rates.append(self.step_once()["train/tokens_per_sec"])
        wall = time.perf_counter() - start
        summary = Summary(status=self.stop_status or "completed", steps=self.step,
                          final_valid_loss=self.last_eval.get("valid/loss"),
                          unigram_entropy=self.data.unigram_entropy, parameters=self.parameters,
                          tokens_per_sec=len(rates) * self.tokens_per_step / wall if rates else None,
                          steady_tokens_per_sec=statistics.median(rates[len(rates) // 2:]) if rates else None,
                          train_seconds=wall)
        self.call("on_end", summary)
        self.writer.close()
        return summary


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
                  " its summary.json is left as it was. A longer run needs a new --run-dir.")
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    if plan.rank == 0:
        print(f"run directory {run_dir}", flush=True)
    trainer = Trainer(cfg, run_dir, resume=resume, overwrite=overwrite)
    if trainer.topo.rank == 0:
        dump_config(cfg, run_dir / "config.yaml")
    summary = trainer.fit()
    if trainer.topo.is_loss_writer:
        summary.config_sha256 = hashlib.sha256(config_text(cfg).encode()).hexdigest()
        summary.write(run_dir)
        if summary.status == "completed":
            print(f"final valid loss {summary.final_valid_loss:.4f} nats/token"
                  f" vs unigram entropy {summary.unigram_entropy:.4f} nats/token"
                  f" ({_rate(summary.tokens_per_sec)} tokens/s over the run,"
                  f" {_rate(summary.steady_tokens_per_sec)} in the steady state)")
    # Leave together: a launcher ends the other ranks as soon as one exits with an error (a divergence),
    # which must not cut the loss writer's summary short.
    torch.distributed.barrier()
    return summary
