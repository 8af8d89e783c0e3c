"""Framework overhead: one process of `prores train`'s step against a bare PyTorch loop (goal: prores at
least 0.95x the bare loop's tokens/s).

prores: :meth:`Trainer.step_once` with its default callbacks (the DeepSpeed pipeline engine, ZeRO-1,
clipping, logging, per-layer diagnostics at ``logging.stats_interval``, progress). Bare: the same
pieces (:func:`prores.model.gpt.gpt_pieces`, the same fused-kernel backend and alpha), the same AdamW
and parameter groups, the same learning-rate schedule, clipping and batches, in a plain
forward/backward/step loop without DeepSpeed. A third arm runs prores's step without the monitors
(prores/monitor/registry.py's MONITORS and the diagnostics' forward hooks): what the engine costs, apart from
what watching costs. Each round runs a block of ``--steps`` steps of each arm, side by side, so that drift in the
machine's load hits a round's arms alike; a ratio is that of the arms' medians, with the 10th to 90th percentile of
the rounds' ratios (prores.study.intervals.Spread): the goal is met when the 10th percentile clears it. Its last line splits
the step without monitors into DeepSpeed's pipeline instructions, and the bare loop's into its phases, in ms a step
("other": the rest of the step: the data, alpha, the callbacks that act, the engine's own bookkeeping).

    python benchmarks/overhead.py [--blocks 12] [--steps 10] [--config tiny.yaml] [--set KEY=VALUE ...]

At the study's shape: ``--config cpu-depth.yaml --set model.num_layers=48`` (and 120).
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from _harness import Phases, benchmark_trainer, interleaved, machine

from prores.data.tokenizers import load_tokenizer
from prores.launcher.builders import adamw_kernel, lr_lambda, param_groups
from prores.launcher.train import Trainer
from prores.model.gpt import gpt_pieces, lm_loss
from prores.model.block import Block
from prores.model.prores import ProRes, ProResScheduler
from prores.monitor.registry import without_monitors
from prores.study.intervals import Spread


class BareLoop:
    """The model's pieces in an nn.Sequential, trained by hand."""

    def __init__(self, cfg, trainer: Trainer):
        m, o = cfg.model, cfg.optim
        pieces = gpt_pieces(m, ProRes(cfg.prores.schedule, cfg.prores.T, m.num_layers),
                            load_tokenizer(cfg.data.tokenizer).vocab_size, cfg.train.seed, trainer.backend)
        self.model = torch.nn.Sequential(*[p.cls(**p.kwargs) for p in pieces])
        self.prores = ProResScheduler(ProRes(cfg.prores.schedule, cfg.prores.T, m.num_layers),
                                      {b.layer_number: b for b in self.model if isinstance(b, Block)})
        self.optimizer = torch.optim.AdamW(param_groups(self.model, o), lr=o.lr, betas=tuple(o.betas),
                                           eps=o.eps, **adamw_kernel(o))
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.cfg, self.data, self.step = cfg, copy.copy(trainer.data.train), 0  # the same batches, in turn
        self.phases = Phases()

    def step_once(self) -> None:
        with self.phases("step"):
            self.prores.step(self.step)
            accum = self.cfg.train.accumulation(1)
            for _ in range(accum):
                tokens, labels = next(self.data)
                with self.phases("forward"):
                    loss = lm_loss(self.model(tokens), labels) / accum
                with self.phases("backward"):
                    loss.backward()
            with self.phases("optimizer"):
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.clip_grad)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.schedule.step()
        self.step += 1
        self.phases.steps += 1


def time_the_engines_instructions(engine, phases: Phases) -> None:
    """Every pipeline instruction of ``engine`` (ForwardPass, BackwardPass, ReduceGrads, OptimizerStep...) timed
    into ``phases``, by its name (the engine looks them up on itself: its class's map stays as it is)."""
    engine._INSTRUCTION_MAP = {instruction: phases.timed(instruction.__name__, execute)
                               for instruction, execute in engine._INSTRUCTION_MAP.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=12, help="rounds: a block of --steps steps of each arm a round")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--config", default=None, help="default: the tiny config; the study's: cpu-depth.yaml")
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    cfg, trainer = benchmark_trainer(args.config, *args.set)
    bare = BareLoop(cfg, trainer)
    trainer.call("on_start")

    instructions = Phases(counting=False)  # the engine's instructions, timed in the arm without monitors only
    time_the_engines_instructions(trainer.engine, instructions)

    def unwatched(steps: int) -> None:
        with without_monitors(trainer):
            for _ in range(steps):
                instructions.counting = True
                with instructions("step"):
                    trainer.step_once()
                instructions.counting = False
                instructions.steps += 1

    def steps_of(step_once):
        return lambda steps: [step_once() for _ in range(steps)]

    loops = {"prores": steps_of(trainer.step_once), "unwatched": unwatched, "bare": steps_of(bare.step_once)}
    for steps in loops.values():  # warm-up: compilation, allocator
        steps(args.steps)
    instructions.reset()
    bare.phases.reset()
    rates = interleaved(loops, args.blocks, args.steps, trainer.tokens_per_step)

    def against_bare(name: str) -> str:  # a round's arms ran side by side: its ratio is what load drift spares
        return Spread.of(rates[name], rates["bare"]).text()

    ours, engine, theirs = (statistics.median(rates[n]) for n in loops)
    print(f"{cfg.model.num_layers} blocks, {trainer.tokens_per_step} tokens a step, kernels {trainer.backend},"
          f" {args.blocks} rounds of {args.steps} steps an arm on {machine()}; medians over the rounds (a ratio's 10th to 90th"
          " percentile over the rounds)")
    print(f"tokens/s: prores {ours:.0f}, without its monitors {engine:.0f}, bare PyTorch loop {theirs:.0f};"
          f" prores / bare = {against_bare('prores')}, without monitors / bare = {against_bare('unwatched')}")
    print(f"ms a step without monitors, DeepSpeed's instructions: {instructions.per_step()}; bare loop: {bare.phases.per_step()}")


if __name__ == "__main__":
    main()
