"""Peak memory of `prores train` steps against the planner, with model.recompute off and on.

Each measurement runs in a fresh process (one rank, fp32, CPU): the peak resident set (VmHWM, reset
through /proc/self/clear_refs once the process group is up) minus the resident set at that moment,
over building the trainer and three steps. glibc is told to serve every allocation above 64 KiB
with mmap and to give it back on free (MALLOC_MMAP_THRESHOLD_), so the resident set follows the
live tensors instead of the allocator's high-water mark.

The runtime itself costs some 40 MiB of that peak whatever the model (library code paged in by the
first GEMM, thread pools, DeepSpeed's and the data pipeline's start-up), which the planner leaves to
its headroom. It is measured the same way, on a 1-block model of 16 tokens (the planned part of which is
subtracted), and the ratio compares the plan with the peak above it.

    python benchmarks/memory.py                   # the table: measured, planned, their ratio; recompute on/off
    python benchmarks/memory.py --one KEY=VALUE...  # one measurement as JSON (what the table runs)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STEPS = 3
# activations dominate: 4 blocks of width 256 over micro-batches of 8 x 512 tokens
SHAPE = ("model.num_layers=4", "model.hidden_size=256", "model.ffn_hidden_size=688", "model.num_heads=4",
         "model.seq_length=512", "train.micro_batch_size=8", "train.precision=fp32", "kernels.backend=eager",
         f"train.steps={STEPS}", "train.eval_interval=1000", "data.eval_samples=8", "logging.progress_bar=false")
# the runtime's fixed cost: one block of width 64, one micro-batch of 16 tokens
RUNTIME = ("model.num_layers=1", "model.hidden_size=64", "model.ffn_hidden_size=160", "model.num_heads=4",
           "model.seq_length=16", "train.micro_batch_size=1") + SHAPE[6:]
CASES = {
    "swiglu, rope": (),
    "swiglu, rope, recompute": ("model.recompute=block",),
    "gelu, learned positions": ("model.mlp=gelu", "model.position=learned"),
    "post-LN, layernorm": ("model.norm_layout=post", "model.norm=layernorm"),
    "8 blocks, micro-batch 4": ("model.num_layers=8", "train.micro_batch_size=4"),
    "8 blocks, micro-batch 4, recompute": ("model.num_layers=8", "train.micro_batch_size=4", "model.recompute=block"),
}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure_here(overrides: tuple[str, ...]) -> dict:
    """In this process: build the trainer and run the steps; the peak above the start, and the plan."""
    from prores.config import load_config
    from prores.data.tokenizers import load_tokenizer
    from prores.launcher.train import Trainer
    from prores.parallel import topology
    from prores.parallel.plan import Layout, stages

    cfg = load_config(None, overrides)
    topology.init(1, 1)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = _status_kib("VmRSS")
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, Path(run_dir), resume=False, callbacks=[])
        for _ in range(STEPS):
            trainer.train_step()
        peak = _status_kib("VmHWM")
    layout = Layout(1, 1, 1, cfg.train.micro_batch_size, cfg.train.grad_accum, cfg.model.recompute)
    planned = stages(cfg, load_tokenizer(cfg.data.tokenizer).vocab_size, layout)[0]
    return {"measured": (peak - start) * 1024, "planned": planned.peak,
            "activations": planned.activations if cfg.model.recompute == "none" else planned.recomputed}


def measure(overrides: tuple[str, ...]) -> dict:
    """:func:`measure_here` in a fresh process."""
    from prores.parallel.rendezvous import own_world

    env = own_world(os.environ)  # a world of its own, not the caller's
    env.update(MALLOC_MMAP_THRESHOLD_="65536", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="2")
    proc = subprocess.run([sys.executable, __file__, "--one", *overrides], capture_output=True, text=True, env=env,
                          timeout=900)
    if proc.returncode:
        raise RuntimeError(f"memory measurement failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def runtime_cost() -> int:
    """Bytes of the peak that are the runtime's, not the model's."""
    r = measure(RUNTIME)
    return r["measured"] - r["planned"]


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(measure_here(tuple(sys.argv[2:]))))
        return
    mib, fixed = 2**20, runtime_cost()
    print(f"the runtime's fixed cost: {fixed / mib:.0f} MiB\n")
    print("| case | measured peak (MiB) | less the runtime's | planned (MiB) | planned / measured |")
    print("| --- | ---: | ---: | ---: | ---: |")
    results = {}
    for name, extra in CASES.items():
        r = results[name] = measure(SHAPE + extra)
        print(f"| {name} | {r['measured'] / mib:.0f} | {(r['measured'] - fixed) / mib:.0f} | {r['planned'] / mib:.0f} |"
              f" {r['planned'] / (r['measured'] - fixed):.2f} |", flush=True)
    for a, b in (("swiglu, rope", "swiglu, rope, recompute"),
                 ("8 blocks, micro-batch 4", "8 blocks, micro-batch 4, recompute")):
        print(f"peak with recompute / without, {a}: {results[b]['measured'] / results[a]['measured']:.2f}"
              f" measured, {results[b]['planned'] / results[a]['planned']:.2f} planned")


if __name__ == "__main__":
    main()
