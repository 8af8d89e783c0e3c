"""The training loop: the model's pieces in a DeepSpeed pipeline engine, driven step by step.

:meth:`Trainer.fit` is the plain loop; logging, diagnostics, checkpoint policy,
stop signals and divergence are callbacks (:mod:`prores.run.callbacks`, chosen by
``train.callbacks`` from :mod:`prores.monitor.registry`).

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

import torch
from megatron.core import parallel_state

from prores.config import Config, config_text, dump_config, warnings_of
from prores.data.tokenizers import load_tokenizer
from prores.errors import UsageError
from prores.launcher.builders import (build_data, build_engine, build_model, resolve_precision, setup_text,
                                      start_processes)
from prores.launcher.preflight import Plan, agreed, clean_up_failed_start, preflight, take_lock
from prores.monitor.registry import build_callbacks
from prores.monitor.tensorboard import RunWriter, mark_resume
from prores.parallel.grad_norm import count_parameters
from prores.parallel.topology import TIMEOUT_S, run_device
from prores.parallel.reshard import load_on_other_layout
from prores.run import rng
from prores.run.callbacks import Callback, exit_if_lapsed
from prores.run.checkpoint import Checkpoints, Found
from prores.run.lock import RunLock
from prores.run.summary import SUMMARY, Summary


class Trainer:
    """Builds everything for one run directory; resumes from its newest good checkpoint unless told not to.

    ``overwrite`` (with ``resume=False``): the run directory's checkpoints, events and summary are deleted
    first.
    """

    def __init__(self, cfg: Config, run_dir: Path, resume: bool = True, overwrite: bool = False,
                 callbacks: Optional[Sequence[Callback]] = None, lock: Optional[RunLock] = None):
        self.cfg, self.run_dir, self.stop_status, self.last_eval = cfg, Path(run_dir), None, {}
        self.lock = lock  # the run directory's, held by rank 0 (the run_lock callback watches it)
        # asked before each checkpoint publish and each event: a holder that lapsed writes nothing more
        self.held = lambda: lock is None or not lock.lapsed()
        self.topo = start_processes(cfg)
        self.device = self.topo.device
        self.cfg = cfg = resolve_precision(cfg, self.device)[0]  # train() resolved it already, before preflight
        c = cfg.checkpoint
        self.checkpoints = Checkpoints(self.run_dir, c.keep_last, c.keep_every, c.keep_steps, held=self.held)
        found = self._starting_point(resume, overwrite)
        tokenizer = load_tokenizer(cfg.data.tokenizer)
        self.data = build_data(cfg, self.run_dir, tokenizer, self.topo.dp_rank, self.topo.dp)
        model = build_model(cfg, self.topo, tokenizer.vocab_size, self.device)
        self.say(f"kernels.backend={cfg.kernels.backend}: using {model.backend} ({model.backend_reason})")
        self.module, self.blocks, self.prores, self.backend = model.module, model.blocks, model.prores, model.backend
        self.engine = build_engine(cfg, self.module, self.topo)
        self.say(setup_text(cfg, self.module))
        self.callbacks = build_callbacks(cfg) if callbacks is None else list(callbacks)
        self._call_before_updates()
        self.tokens_per_step = cfg.train.global_batch(self.topo.dp) * cfg.model.seq_length
        if found is not None:
            self._resume(found)
        self.writer = RunWriter(self.run_dir, self.topo.rank, self.topo.is_loss_writer, self.topo.is_stage_writer,
                                held=self.held)
        self.parameters = count_parameters(list(self.module.parameters()), self.topo.tp_rank,
                                           parallel_state.get_model_parallel_group())

    def _starting_point(self, resume: bool, overwrite: bool) -> Optional[Found]:
        """The checkpoint to resume from (preflight checked that it fits), after ``--overwrite`` cleared the
        run directory's checkpoints, events and summary."""
        if overwrite and not resume:
            self.checkpoints.remove_all()
            if self.topo.rank == 0:
                for old in [*self.run_dir.glob("events.out.tfevents.*"), self.run_dir / SUMMARY]:
                    old.unlink(missing_ok=True)
        return self.checkpoints.newest_good(self.say) if resume else None

    def _resume(self, found: Found) -> None:
        self.load(found)
        if self.topo.rank == 0:
            mark_resume(self.run_dir, self.step)
        torch.distributed.barrier()
        time.sleep(1.05)  # see mark_resume: the writers' files must sort after the marker

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
        """The checkpoint's state on this run's layout. The layout that wrote it loads through DeepSpeed's own
        :meth:`load_checkpoint`; any other (tp, pp, dp or precision changed) through the one path that cuts
        every parameter's state by name (:mod:`prores.parallel.reshard`), except ZeRO-0 fp32 on another dp,
        whose optimizer state every rank holds whole. Preflight refused what neither can do exactly."""
        saved, topo = found.manifest["parallel"], self.topo
        now = {"tp": topo.tp, "pp": topo.pp, "dp": topo.dp}
        precision = found.manifest["config"]["train"].get("precision", "fp32")
        same = {k: saved[k] for k in now} == now and precision == self.cfg.train.precision
        started = time.perf_counter()
        if same or not self.engine.zero_optimization():
            path, client = self.engine.load_checkpoint(str(self.checkpoints.root), tag=found.path.name)
            if path is None:
                raise UsageError(f"DeepSpeed could not load checkpoint {found.path}; start a new --run-dir.")
        else:
            client = load_on_other_layout(self.engine, found.path, saved, topo.tp_rank, topo.tp)
        self.data.train.load_state_dict(client["data"])
        self.prores.load_state_dict(client["prores"])
        self._learning_rate_from_config()
        for callback in self.callbacks:
            if callback.name is not None and callback.name in client["callbacks"]:
                callback.load_state_dict(client["callbacks"][callback.name])
        streams = rng.restore(found.path / "rng", saved, topo, self.cfg.train.seed, self.step)
        if same:
            self.say(f"resuming from step {self.step}: {found.path}")
        else:
            self.say(f"resuming step {self.step} from tp{saved['tp']} x pp{saved['pp']} x dp{saved['dp']} on"
                     f" tp{topo.tp} x pp{topo.pp} x dp{topo.dp}: {found.path} (resharded in"
                     f" {time.perf_counter() - started:.2f} s; {streams})")

    def _learning_rate_from_config(self) -> None:
        """A resume keeps the optimizer's moments and the schedule's position but takes the peak
        learning rate from this run's config (the checkpoint's would otherwise win silently): so
        ``--set optim.lr=...`` on a resume, e.g. after a spike, takes effect."""
        schedule = self.engine.lr_scheduler
        groups = schedule.optimizer.param_groups
        schedule.base_lrs = [self.cfg.optim.lr * g.get("lr_scale", 1.0) for g in groups]
        for group, base, factor in zip(groups, schedule.base_lrs, schedule.lr_lambdas):
            group["lr"] = base * factor(schedule.last_epoch)

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
        self.call("pre_eval", self.step)
        metrics = {}
        for tag, batches in [("valid", self.data.valid)] + [(f"eval/{n}", b) for n, b in self.data.evals.items()]:
            losses = [float(self.engine.eval_batch(iter([batch]), num_micro_batches=1)) for batch in batches]
            loss = sum(losses) / len(losses)
            metrics.update({f"{tag}/loss": loss, f"{tag}/ppl": math.exp(min(loss, 50.0))})
        self.last_eval = metrics
        self.call("post_eval", self.step, metrics)
        return metrics

    def save(self) -> Optional[Path]:
        """The checkpoint of this step, or None if it could not be written (said once; the run goes on)."""
        t = self.topo
        self.call("pre_checkpoint", self.step)
        client = {"data": self.data.train.state_dict(), "prores": self.prores.state_dict(),
                  "callbacks": {c.name: c.state_dict() for c in self.callbacks if c.name is not None},
                  "config": self.cfg.to_dict()}
        path = self.checkpoints.save(self.engine, self.step, client_state=client,
                                     meta={"world_size": t.world_size, "parallel": {"tp": t.tp, "pp": t.pp, "dp": t.dp},
                                           "config": self.cfg.to_dict()}, say=self.say)
        exit_if_lapsed(self, self.step - 1)  # lapsed while saving: it published nothing, and writes nothing more
        if path is not None:
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
    """One run in ``run_dir``, holding its lock; None when the run was finished already (nothing is touched
    then)."""
    created = not run_dir.exists()
    requested = cfg.train.precision
    cfg, why = resolve_precision(cfg, run_device())  # preflight compares it with the checkpoint's
    lock = RunLock(run_dir)
    TIMEOUT_S["collectives"] = cfg.parallel.timeout  # before preflight's first collective: every group has it
    try:
        agreed(lambda: take_lock(cfg, lock))
        plan = agreed(lambda: preflight(cfg, run_dir, resume, overwrite))
    except UsageError:
        lock.release()
        clean_up_failed_start(run_dir, created, int(os.environ.get("WORLD_SIZE", "1")))
        raise
    try:
        return _train(cfg, run_dir, plan, resume, overwrite, lock, f"train.precision={requested}:"
                      f" using {cfg.train.precision} ({why})")
    finally:
        lock.release()


def _train(cfg: Config, run_dir: Path, plan: Plan, resume: bool, overwrite: bool, lock: RunLock,
           precision: str) -> Optional[Summary]:
    if plan.finished:
        if plan.rank == 0:
            print(f"run directory {run_dir} is finished (step {plan.newest.step}, train.steps={cfg.train.steps});"
                  " its summary.json is left as it was. A longer run needs a new --run-dir.")
        return None
    if plan.rank == 0:
        for warning in warnings_of(cfg):
            print(f"prores: warning: {warning}", flush=True)
        print(f"run directory {run_dir}", flush=True)
        print(precision, flush=True)
    trainer = Trainer(cfg, run_dir, resume=resume, overwrite=overwrite, lock=lock)
    if trainer.topo.rank == 0:
        dump_config(cfg, run_dir / "config.yaml")
    summary = trainer.fit()
    if trainer.topo.is_loss_writer and summary.status != "lost_lock":  # the directory may be another's now
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
