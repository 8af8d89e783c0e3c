"""The training step against this CPU's matmul rate: is a faster study a matter of schedule, kernels, or nothing?

1. The matmul rate at the study's shapes: for width h and FFN f (configs/cpu-depth.yaml: 64 and 172; also 128
   and 344), the step's tokens (micro-batch x sequence) times each projection of a block (QKV [h, 3h], out
   [h, h], fc1 [h, 2f] with SwiGLU, fc2 [f, h]), each as its forward, input-gradient and weight-gradient
   matmul; GFLOP/s = 2·m·k·n / time, median of --reps.
2. A short `prores train` of the study's model at each --depths: its steady tokens/s times the model's training
   FLOPs per token (prores.model.size: 3x the forward's 2 per weight of the blocks and the head, and attention's
   scores) is the step's achieved rate, printed as a fraction of the measured matmul rate at that width.

Usage: python benchmarks/roofline.py [--widths 64 128] [--depths 12 48] [--steps 30] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from _harness import machine
from prores.config import load_config
from prores.data.tokenizers import load_tokenizer
from prores.model.size import block_flops_per_token, padded_vocab_size
from prores.parallel.rendezvous import own_world


def matmul_gflops(tokens: int, h: int, f: int, reps: int) -> float:
    """The blocks' projections as a training step runs them, one after another: each forward (x·W), its input
    gradient (g·Wᵀ) and its weight gradient (xᵀ·g), into preallocated outputs (a fresh large output would
    time the page faults of its allocation); total FLOPs over the median time."""
    shapes = [(h, 3 * h), (h, h), (h, 2 * f), (f, h)]
    products = []
    for k, n in shapes:
        x, w, g = torch.randn(tokens, k), torch.randn(k, n), torch.randn(tokens, n)
        products += [(x, w, torch.empty(tokens, n)), (g, w.t(), torch.empty(tokens, k)),
                     (x.t(), g, torch.empty(k, n))]
    flops = 3 * sum(2 * tokens * k * n for k, n in shapes)
    times = []
    for _ in range(reps + 1):  # the first is a warm-up
        start = time.perf_counter()
        for a, b, out in products:
            torch.matmul(a, b, out=out)
        times.append(time.perf_counter() - start)
    return flops / statistics.median(times[1:]) / 1e9


def step_gflops(overrides: list[str], depth: int, steps: int) -> tuple[float, float]:
    """(tokens/s, GFLOP/s) of a short `prores train` of cpu-depth.yaml at ``depth`` blocks, one process."""
    run_dir = Path(tempfile.mkdtemp(prefix="prores-roofline-"))
    sets = [f"model.num_layers={depth}", f"train.steps={steps}", f"train.eval_interval={steps}",
            "logging.progress_bar=false", *overrides]
    cmd = [sys.executable, "-m", "prores", "train", "cpu-depth.yaml", "--run-dir", str(run_dir)]
    for o in sets:
        cmd += ["--set", o]
    subprocess.run(cmd, check=True, capture_output=True, env=own_world(os.environ))
    tokens_per_sec = json.loads((run_dir / "summary.json").read_text())["steady_tokens_per_sec"]
    m = load_config("cpu-depth.yaml", sets).model
    vocab = padded_vocab_size(load_tokenizer(load_config("cpu-depth.yaml", sets).data.tokenizer).vocab_size,
                              m.vocab_multiple)
    head = 3 * 2 * m.hidden_size * vocab  # the output projection
    return tokens_per_sec, tokens_per_sec * (depth * block_flops_per_token(m) + head) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--depths", type=int, nargs="+", default=[12, 48])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config overrides for the trainings, repeatable (the smoke test's tiny model)")
    args = parser.parse_args()
    base = load_config("cpu-depth.yaml", args.set)
    tokens = base.train.micro_batch_size * base.model.seq_length
    print(f"{machine()}, {tokens} tokens a micro-batch")
    print("width  FFN   matmul GFLOP/s (the blocks' projections)")
    rates = {}
    for h in args.widths:
        f = round(h * base.model.ffn_hidden_size / base.model.hidden_size)
        rates[h] = matmul_gflops(tokens, h, f, args.reps)
        print(f"{h:5d}  {f:4d}  {rates[h]:8.2f}")
    h = base.model.hidden_size
    matmul = rates.get(h) or matmul_gflops(tokens, h, base.model.ffn_hidden_size, args.reps)
    print(f"\nprores train cpu-depth.yaml (width {h}), steady state:")
    print("blocks  tokens/s  step GFLOP/s  of the matmul rate")
    for depth in args.depths:
        tps, achieved = step_gflops(args.set, depth, args.steps)
        print(f"{depth:6d}  {tps:8.0f}  {achieved:12.2f}  {achieved / matmul:17.1%}")


if __name__ == "__main__":
    main()
