"""What model.fp32_residual changes under bf16: how much of a deep block's alpha·F reaches the
residual stream during its warmup, and the loss of a short run against the same run in fp32.

1. Survival. One bf16 block (the last of ``--layers``, ProRes linear, T = ``--T``) on a stream of unit
   RMS, at steps t = 1 .. T (alpha = t/(T·L)). The block's contribution is Δ = out - x; with an fp32
   stream it is alpha·F up to fp32 rounding, so Δ_fp32 is the reference. Survival is the part of it
   that arrives through a bf16 stream, <Δ_bf16, Δ_fp32> / ||Δ_fp32||² (1 when nothing rounds away;
   rounding to the nearest bf16 either drops an element's update or rounds it to a whole ulp of x),
   and "vanished" the share of elements whose Δ_bf16 is exactly 0. The branches are the same bf16
   computations in both.
2. Loss. Three short runs of the same config, side by side: fp32, bf16, bf16 + fp32_residual; their
   final validation losses and the bf16 runs' differences from fp32.

    python benchmarks/fp32_residual.py [--layers 120] [--T 500] [--steps 150] [--seeds 1234 1] [--skip-survival]
        [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from prores.parallel.rendezvous import own_world

RUN = ("model.num_layers=24", "model.hidden_size=128", "model.ffn_hidden_size=344", "model.num_heads=4",
       "model.seq_length=128", "train.micro_batch_size=8", "prores.T=20", "optim.lr=3e-3",
       "optim.warmup_steps=20", "train.eval_interval=1000", "data.eval_samples=64", "logging.progress_bar=false")


def survival(layers: int, T: int, steps: list[int]) -> list[dict]:
    from prores.config import load_config
    from prores.model.block import Block
    from prores.model.prores import ProRes
    from prores.parallel import topology

    topology.init(1, 1)
    out = []
    for fp32_residual in (False, True):
        m = load_config(None, (f"model.num_layers={layers}", "model.hidden_size=512", "model.ffn_hidden_size=1368",
                               "model.num_heads=8", f"model.fp32_residual={str(fp32_residual).lower()}")).model
        block = Block(m, ProRes("linear", T, layers), layers, seed=0).to(torch.bfloat16).eval()
        x = torch.randn(256, 2, m.hidden_size, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        for t in steps:
            block.set_step(t)
            with torch.no_grad():
                stream = x.float() if fp32_residual else x
                out.append({"fp32_residual": fp32_residual, "step": t, "delta": (block(stream).double() - x.double())})
    rows = []
    for t in steps:
        bf16, fp32 = (next(r["delta"] for r in out if r["step"] == t and r["fp32_residual"] is f) for f in (False, True))
        rows.append({"step": t, "alpha": t / (T * layers), "survival": ((bf16 * fp32).sum() / fp32.square().sum()).item(),
                     "vanished": (bf16 == 0).double().mean().item()})
    return rows


def final_loss(overrides: tuple[str, ...]) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        env = own_world(os.environ)
        subprocess.run([sys.executable, "-m", "prores", "train", "--run-dir", run_dir,
                        *[a for o in overrides for a in ("--set", o)]], check=True, capture_output=True, env=env)
        return json.loads((Path(run_dir) / "summary.json").read_text())["final_valid_loss"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=120)
    parser.add_argument("--T", type=int, default=500)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1234])
    parser.add_argument("--skip-survival", action="store_true")
    parser.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                        help="on top of the three runs' config (the smoke test's tiny model)")
    args = parser.parse_args()
    if not args.skip_survival:
        print_survival(args)
    for seed in args.seeds:
        run = RUN + tuple(args.sets) + (f"train.steps={args.steps}", f"train.seed={seed}")
        losses = {name: final_loss(run + extra) for name, extra in (
            ("fp32", ("train.precision=fp32",)),
            ("bf16", ("train.precision=bf16", "model.fp32_residual=false")),
            ("bf16 + fp32_residual", ("train.precision=bf16", "model.fp32_residual=true")))}
        print(f"{args.steps} steps of {' '.join(run)}:")
        for name, loss in losses.items():
            print(f"  {name:22s} final valid loss {loss:.4f} ({loss - losses['fp32']:+.4f} vs fp32)", flush=True)


def print_survival(args) -> None:
    print(f"block {args.layers} of {args.layers}, width 512, T={args.T}: its contribution out - x in bf16")
    print("| step | alpha | bf16 stream: survival | elements where it vanished |")
    print("| ---: | ---: | ---: | ---: |")
    for r in survival(args.layers, args.T, [1, 10, 50, 100, 200, args.T]):
        print(f"| {r['step']} | {r['alpha']:.2e} | {r['survival']:.3f} | {r['vanished']:.1%} |")
    print("(with model.fp32_residual=true the survival is 1 by construction: it is the reference)\n", flush=True)


if __name__ == "__main__":
    main()
