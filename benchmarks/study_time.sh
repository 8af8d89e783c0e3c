#!/usr/bin/env bash
# What configs/sweeps/cpu-depth.yaml costs on this machine, measured rather than read off a shared run:
# at 12, 48 and 120 blocks two 50-step cells of configs/cpu-depth.yaml train at once, each with
# OMP_NUM_THREADS = cores / 2, as `prores sweep --jobs 2` runs them; prints each depth's tokens/s, the
# cost per token fitted linearly in depth, and the 72 cells' training time at --jobs 2: its lower bound
# (the sum over two) and the makespan of the runner's schedule with the cells in grid order and longest first. Then times
# `prores eval` (the spec's two offline tasks, limit 50) on a 120-block checkpoint. About 5 minutes on
# 2 cores; run it on a quiet machine.  Usage: bash benchmarks/study_time.sh [OUT_DIR [--set KEY=VALUE ...]]
# (the --set overrides go to every training, last: the smoke test's tiny model)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d)}"
shift || true
mkdir -p "$out"
export OMP_NUM_THREADS=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
for L in 12 48 120; do
  for s in 1 2; do
    prores train cpu-depth.yaml --set model.num_layers=$L --set train.steps=50 --set train.eval_interval=25 \
      --set train.seed=$s --set checkpoint.interval=50 "$@" --run-dir "$out/L$L-s$s" > "$out/L$L-s$s.log" 2>&1 &
  done
  wait
done
python - "$out" <<'PY'
import json, sys
import numpy
from prores.config import load_config
from prores.study.runners import longest_first
from prores.study.sweep import expand

out = sys.argv[1]
tps = {L: numpy.mean([json.load(open(f"{out}/L{L}-s{s}/summary.json"))["steady_tokens_per_sec"] for s in (1, 2)])
       for L in (12, 48, 120)}
for L, v in tps.items():
    print(f"{L:>4} blocks: {v:7.0f} tokens/s a cell, two at once")
depths = numpy.array(list(tps), dtype=float)
per_token = 1 / numpy.array(list(tps.values()))
slope, intercept = numpy.polyfit(depths, per_token, 1)
worst = max(abs(intercept + slope * d - p) / p for d, p in zip(depths, per_token))
print(f"seconds per token: {intercept:.3g} + {slope:.3g}·L (worst residual {worst:.1%})")
_, cells = expand("cpu-depth.yaml")
seconds = {}
for cell in cells:
    cfg = load_config("cpu-depth.yaml", cell.overrides)
    tokens = cfg.train.steps * cfg.train.micro_batch_size * cfg.train.grad_accum * cfg.model.seq_length
    seconds[cell.name] = tokens * (intercept + slope * cfg.model.num_layers)


def makespan(order, jobs=2):
    """The local runner's schedule: each cell, in this order, starts on the first of ``jobs`` slots to free."""
    slots = [0.0] * jobs
    for cell in order:
        slots[slots.index(min(slots))] += seconds[cell.name]
    return max(slots)


total = sum(seconds.values())
print(f"cpu-depth.yaml: {len(cells)} cells, {total / 3600:.2f} h of training; with --jobs 2 at best"
      f" {total / 2 / 3600:.2f} h, in grid order {makespan(cells) / 3600:.2f} h,"
      f" longest first (the runner's order) {makespan(longest_first(cells)) / 3600:.2f} h")
PY
/usr/bin/time -f "prores eval of the 120-block cell (2 tasks, limit 50, batch 16): %e s" \
  prores eval "$out/L120-s1" --tasks prores_lastword,prores_rolling_ppl --limit 50 --batch-size 16 > "$out/eval.log" 2>&1 \
  || { tail -n 20 "$out/eval.log"; exit 1; }
tail -n 1 "$out/eval.log"
