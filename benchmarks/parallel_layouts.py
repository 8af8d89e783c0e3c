"""Throughput per parallel layout, and measured pipeline efficiency against the 1F1B bound.

Every run is a real `prores train` under torchrun on this machine (gloo on
CPU, nccl on GPU), one thread per process, same model and global batch.

1. tokens/s for (tp, pp, dp) in {(1,1,1), (2,1,1), (1,2,1), (1,1,2), (2,2,1)}, side by side.
2. For pp = 2 and m micro-batches per step (m = grad_accum), the efficiency
   E = tokens/s(pp=2) / (2 · tokens/s(pp=1)) next to the 1F1B bound m / (m + p − 1).

Usage: python benchmarks/parallel_layouts.py [--steps 16] [--micro-batches 1 2 4 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from prores.parallel.rendezvous import own_world

MODEL = ("model.num_layers=8", "model.hidden_size=128", "model.ffn_hidden_size=344", "model.num_heads=4",
         "model.seq_length=128", "logging.progress_bar=false", "train.eval_interval=100000",
         "data.eval_samples=8")


def tokens_per_sec(tp: int, pp: int, dp: int, steps: int, micro: int, accum: int, extra=()) -> float:
    run_dir = Path(tempfile.mkdtemp(prefix="prores-bench-"))
    overrides = MODEL + tuple(extra) + (f"parallel.tp={tp}", f"parallel.pp={pp}", f"train.steps={steps}",
                         f"train.micro_batch_size={micro}", f"train.grad_accum={accum}")
    cmd = ["torchrun", "--standalone", f"--nproc_per_node={tp * pp * dp}", "-m", "prores", "train",
           "--run-dir", str(run_dir)]
    for o in overrides:
        cmd += ["--set", o]
    env = own_world(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return json.loads((run_dir / "summary.json").read_text())["tokens_per_sec"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--layouts", nargs="+", default=["1,1,1", "2,1,1", "1,2,1", "1,1,2", "2,2,1"],
                        metavar="TP,PP,DP", help="the first is the reference (default: five layouts)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config overrides, repeatable (the smoke test's tiny model)")
    args = parser.parse_args()

    print("layout (tp,pp,dp)   tokens/s   vs 1x1x1")
    base = None
    for tp, pp, dp in (tuple(map(int, layout.split(","))) for layout in args.layouts):
        # the same global batch of 8 sequences on every layout
        tps = tokens_per_sec(tp, pp, dp, args.steps, micro=8 // dp, accum=1, extra=args.set)
        base = base or tps
        print(f"({tp},{pp},{dp})            {tps:8.0f}   {tps / base:6.2f}x")

    p = 2
    print(f"\npipeline efficiency, pp={p}, micro-batch 2, m = micro-batches per step")
    print("m   tok/s pp=1   tok/s pp=2   measured E   1F1B bound m/(m+p-1)")
    for m in args.micro_batches:
        one = tokens_per_sec(1, 1, 1, args.steps, micro=2, accum=m, extra=args.set)
        two = tokens_per_sec(1, p, 1, args.steps, micro=2, accum=m, extra=args.set)
        print(f"{m:<3} {one:10.0f}   {two:10.0f}   {two / (p * one):10.3f}   {m / (m + p - 1):10.3f}")


if __name__ == "__main__":
    main()
