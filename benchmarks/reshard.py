"""What a resume on another layout costs (prores.parallel.reshard): its time and the resuming process's peak
memory, against the model's size.

For each width: a tp2 × pp2 run (4 processes) and a 1-process run each write a checkpoint after one step;
both are resumed on 1 process, the first resharded from tp2 × pp2, the second on its own layout (DeepSpeed's
plain load). The difference of the two peak RSS is what the reshard itself holds, shown against the
checkpoint's bytes and the model's fp32 weights + Adam moments (12 bytes a parameter).

Usage: python benchmarks/reshard.py [--widths 128 256 512]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from prores.parallel.rendezvous import own_world

MB = 2**20


EXTRA: list[str] = []  # --set overrides, last


def train(run_dir: Path, width: int, procs: int, layout: tuple[str, ...], steps: int) -> subprocess.CompletedProcess:
    overrides = ("model.num_layers=8", f"model.hidden_size={width}", f"model.ffn_hidden_size={width * 2}",
                 "model.num_heads=4", "model.seq_length=64", "train.micro_batch_size=4", f"train.steps={steps}",
                 "checkpoint.interval=1", "checkpoint.keep_last=3", "train.eval_interval=100000",
                 "data.eval_samples=16", "kernels.backend=eager", "logging.progress_bar=false", *layout, *EXTRA)
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
                if procs > 1 else ["/usr/bin/time", "-f", "peak-rss-kb %M", sys.executable])  # one: its peak RSS
    cmd = launcher + ["-m", "prores", "train", "--run-dir", str(run_dir)]
    for o in overrides:
        cmd += ["--set", o]
    env = own_world(os.environ) | {"OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)


def checkpoint_at_step_1(run_dir: Path, width: int, procs: int, layout: tuple[str, ...]) -> None:
    train(run_dir, width, procs, layout, steps=2)
    shutil.rmtree(run_dir / "checkpoints" / "global_step2")
    (run_dir / "summary.json").unlink()


def resume(run_dir: Path, width: int) -> tuple[float, float | None]:
    """(peak RSS in MB, the reshard's seconds as the resume line says, or None for a plain load)."""
    proc = train(run_dir, width, 1, (), steps=2)
    peak = int(re.search(r"peak-rss-kb (\d+)", proc.stderr).group(1)) / 1024
    took = re.search(r"resharded in ([\d.]+) s", proc.stdout)
    return peak, float(took.group(1)) if took else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config overrides, repeatable (the smoke test's tiny model)")
    args = parser.parse_args()
    EXTRA.extend(args.set)
    print("width  parameters  checkpoint MB  fp32+Adam MB  reshard s  peak RSS MB: resharded  plain  extra  extra/ckpt")
    for width in args.widths:
        tmp = Path(tempfile.mkdtemp(prefix="prores-reshard-"))
        checkpoint_at_step_1(tmp / "tp2pp2", width, 4, ("parallel.tp=2", "parallel.pp=2"))
        checkpoint_at_step_1(tmp / "one", width, 1, ())
        ckpt = sum(f.stat().st_size for f in (tmp / "tp2pp2" / "checkpoints" / "global_step1").iterdir()
                   if f.is_file()) / MB
        resharded, seconds = resume(tmp / "tp2pp2", width)
        plain, _ = resume(tmp / "one", width)
        n = json.loads((tmp / "one" / "summary.json").read_text())["parameters"]
        print(f"{width:5d}  {n:10,d}  {ckpt:13.1f}  {n * 12 / MB:12.1f}  {seconds:9.2f}  {resharded:22.0f}  "
              f"{plain:5.0f}  {resharded - plain:5.0f}  {(resharded - plain) / ckpt:10.2f}")
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
