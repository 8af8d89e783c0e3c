"""The study's step under faster settings against today's eager step (goal: at least 1.5x the eager tokens/s).

Two trainers of the same config in one process: "eager" (``kernels.backend=eager``, ``optim.implementation=auto``:
plain torch ops and torch's own AdamW pick, a loop over tensors on CPU) and "fast" (``--fast``, by default each
block compiled whole and torch's fused AdamW). Each arm is :meth:`Trainer.step_once` with its callbacks, warmed up
(compilation) before the rounds; each round runs ``--steps`` steps of each arm, side by side, so that drift in
the machine's load hits both alike. The ratio is that of the medians with the rounds' 10th to 90th percentile.

    python benchmarks/speedup.py [--blocks 12] [--steps 10] [--config cpu-depth.yaml] [--fast KEY=VALUE ...]
                                 [--set KEY=VALUE ...]

At the study's shape: ``--set model.num_layers=48`` (and 120).
"""

from __future__ import annotations

import argparse
import statistics

from _harness import benchmark_trainer, interleaved, machine

from prores.study.intervals import Spread

EAGER = ("kernels.backend=eager", "optim.implementation=auto")
FAST = ["kernels.backend=block", "optim.implementation=fused"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=12, help="rounds: a block of --steps steps of each arm a round")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--config", default="cpu-depth.yaml")
    parser.add_argument("--fast", action="append", default=None, metavar="KEY=VALUE",
                        help=f"the fast arm's settings (default {' '.join(FAST)})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="both arms")
    args = parser.parse_args()
    fast = args.fast or FAST
    trainers = {"eager": benchmark_trainer(args.config, *args.set, *EAGER)[1],
                "fast": benchmark_trainer(args.config, *args.set, *fast)[1]}
    loops = {}
    for name, trainer in trainers.items():
        trainer.call("on_start")
        loops[name] = lambda steps, step_once=trainer.step_once: [step_once() for _ in range(steps)]
        loops[name](args.steps)  # warm-up: compilation, allocator
    eager = trainers["eager"]
    rates = interleaved(loops, args.blocks, args.steps, eager.tokens_per_step)
    print(f"{eager.cfg.model.num_layers} blocks, ProRes {eager.cfg.prores.schedule}, {eager.tokens_per_step} tokens a"
          f" step, {args.blocks} rounds of {args.steps} steps an arm on {machine()}")
    print(f"tokens/s: eager {statistics.median(rates['eager']):.0f}, {' '.join(fast)}"
          f" {statistics.median(rates['fast']):.0f}; fast / eager = {Spread.of(rates['fast'], rates['eager']).text()}"
          " (the rounds' 10th to 90th percentile)")


if __name__ == "__main__":
    main()
