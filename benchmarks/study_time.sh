#!/usr/bin/env bash
# What configs/sweeps/cpu-depth.yaml costs on this machine, measured rather than read off a shared run, under
# each kernel backend: at 12, 48 and 120 blocks two 50-step cells of configs/cpu-depth.yaml train at once,
# each with OMP_NUM_THREADS = cores / 2, as `prores sweep --jobs 2` runs them, under kernels.backend=eager, then
# compile (the add+norm pieces) and block (each block compiled whole) with a sweep's shared Inductor cache
# (RUNS/SWEEP/inductor-cache), which one cell of each fills cold first, timed on its own. Prints the machine, each
# depth's tokens/s, the cost per token fitted linearly in depth, a cell's fixed cost (its wall time less its steps
# at the steady rate: start-up, compilation, evaluations, checkpoints) and the 72 cells' time at --jobs 2: the sum
# over two slots and the makespan of the runner's schedule with the cells in grid order and longest first; under a
# compiling backend each kernel set (a norm layout with ProRes on or off) is compiled cold once a sweep. Then times
# `prores eval` (the spec's two offline tasks, limit 50) on a 120-block checkpoint. About 10 minutes on 2 cores;
# run it on a quiet machine.
# Usage: bash benchmarks/study_time.sh [OUT_DIR [--set KEY=VALUE ...]]  (the --set overrides go to every
# training: the smoke test's tiny model); BACKENDS="eager block" and DEPTHS="2 3" choose fewer.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d)}"
shift || true
sets=("$@")
read -r -a backends <<< "${BACKENDS:-eager compile block}"
read -r -a depths <<< "${DEPTHS:-12 48 120}"
mkdir -p "$out"
export OMP_NUM_THREADS=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
export TORCHINDUCTOR_CACHE_DIR="$out/inductor-cache"
cell() {  # BACKEND LAYERS SEED: a 50-step training; its wall time in RUN.wall
  local run="$out/$1-L$2-s$3"
  /usr/bin/time -f %e -o "$run.wall" prores train cpu-depth.yaml --set model.num_layers="$2" --set train.steps=50 \
    --set train.eval_interval=25 --set train.seed="$3" --set checkpoint.interval=50 ${sets[@]+"${sets[@]}"} \
    --set kernels.backend="$1" --run-dir "$run" > "$run.log" 2>&1 || { tail -n 20 "$run.log"; return 1; }
}
for backend in "${backends[@]}"; do
  [ "$backend" = eager ] || cell "$backend" "${depths[0]}" 0  # the sweep's first cell of this backend, alone: cold
done
for backend in "${backends[@]}"; do
  for L in "${depths[@]}"; do
    cell "$backend" "$L" 1 & first=$!
    cell "$backend" "$L" 2
    wait "$first"
  done
done
python - "$out" "${depths[*]}" "${backends[*]}" <<'PY'
import json, sys
import numpy
from prores.config import load_config
from prores.study.runners import longest_first
from prores.study.sweep import expand

sys.path.insert(0, "benchmarks")
from _harness import machine

out, depths, backends = sys.argv[1], [int(d) for d in sys.argv[2].split()], sys.argv[3].split()
print(f"{machine()} a cell, two cells at once")


def cell(backend, layers, seed):
    run = f"{out}/{backend}-L{layers}-s{seed}"
    summary = json.load(open(f"{run}/summary.json"))
    tokens = summary["tokens_per_sec"] * summary["train_seconds"]
    wall = float(open(f"{run}.wall").read().split()[-1])
    return summary["steady_tokens_per_sec"], wall - tokens / summary["steady_tokens_per_sec"]


_, cells = expand("cpu-depth.yaml")
configs = {c.name: load_config("cpu-depth.yaml", c.overrides) for c in cells}
kernel_sets = {(cfg.model.norm_layout, cfg.prores.schedule) for cfg in configs.values()}
fits = {}
for backend in backends:
    measured = {L: [cell(backend, L, s) for s in (1, 2)] for L in depths}
    tps = {L: numpy.mean([rate for rate, _ in m]) for L, m in measured.items()}
    fixed = numpy.mean([f for m in measured.values() for _, f in m])
    print(f"kernels {backend}: " + ", ".join(f"{L} blocks {v:.0f}" for L, v in tps.items())
          + f" tokens/s a cell, two at once; a cell's fixed cost {fixed:.1f} s")
    slope, intercept = numpy.polyfit(depths, [1 / tps[L] for L in depths], 1)
    worst = max(abs(intercept + slope * L - 1 / tps[L]) * tps[L] for L in depths)
    print(f"  seconds per token: {intercept:.3g} + {slope:.3g}·L (worst residual {worst:.1%})")
    seconds = {}
    for name, cfg in configs.items():
        tokens = cfg.train.steps * cfg.train.micro_batch_size * cfg.train.grad_accum * cfg.model.seq_length
        seconds[name] = fixed + tokens * (intercept + slope * cfg.model.num_layers)
    cold = 0.0
    if backend != "eager":
        cold = cell(backend, depths[0], 0)[1] - fixed
        print(f"  compiling a kernel set cold: {cold:.1f} s more, once for each of the sweep's {len(kernel_sets)}")
    total = sum(seconds.values()) + cold * len(kernel_sets)

    def makespan(order, jobs=2):
        """The local runner's schedule: each cell, in this order, starts on the first of ``jobs`` slots to free."""
        slots = [0.0] * jobs
        for c in order:
            slots[slots.index(min(slots))] += seconds[c.name]
        return max(slots) + cold * len(kernel_sets) / jobs

    print(f"  cpu-depth.yaml: {len(cells)} cells, {total / 3600:.2f} h; with --jobs 2 at best {total / 2 / 3600:.2f} h,"
          f" in grid order {makespan(cells) / 3600:.2f} h, longest first (the runner's order)"
          f" {makespan(longest_first(cells)) / 3600:.2f} h")
PY
/usr/bin/time -f "prores eval of the ${depths[-1]}-block cell (2 tasks, limit 50, batch 16): %e s" \
  prores eval "$out/${backends[0]}-L${depths[-1]}-s1" --tasks prores_lastword,prores_rolling_ppl --limit 50 --batch-size 16 \
  > "$out/eval.log" 2>&1 || { tail -n 20 "$out/eval.log"; exit 1; }
tail -n 1 "$out/eval.log"
