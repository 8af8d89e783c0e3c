"""Peak memory of `prores train` steps against the planner, per rank, on one process or under torchrun.

Each measurement runs in fresh processes (CPU): every rank's peak resident set (VmHWM, reset through
/proc/self/clear_refs once the process group is up) minus its resident set at that moment, over building
the trainer and three steps, next to what `prores plan` plans for that rank's pipeline stage. glibc is told
to serve every allocation above 64 KiB with mmap and to give it back on free (MALLOC_MMAP_THRESHOLD_), so
the resident set follows the live tensors instead of the allocator's high-water mark.

The runtime itself costs some 40 MiB of that peak whatever the model (library code paged in by the
first GEMM, thread pools, DeepSpeed's and the data pipeline's start-up, gloo's buffers under a
launcher), which the planner leaves to its headroom. It is measured the same way, under the same launch,
on a model of one block a stage and 16 tokens (the planned part of which is subtracted), and the ratio
compares the plan with the peak above it.

Two regimes: activations dominate (4 blocks of width 256, 8 × 512 tokens: weights, gradients and
optimizer states are ~11% of the plan) and parameters dominate (4 blocks of width 768, 2 × 16 tokens:
~99%), where bf16's 2 + 2 + 12 bytes a parameter and ZeRO-1's sharding of the 12 over dp show.

On a GPU (``--cuda``, run by benchmarks/gpu_check.sh) the peak is torch.cuda.max_memory_allocated above
what was allocated once the process group was up, for a bf16 model of the paper's width with and without
recompute, against the plan for a GPU (DeepSpeed's reduce bucket allocated whole).

    python benchmarks/memory.py                   # the table: measured, planned, their ratio
    python benchmarks/memory.py --cuda            # the same on one GPU
    python benchmarks/memory.py --one KEY=VALUE...  # one process's measurement as JSON (what the table runs)
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STEPS = 3
COMMON = ("kernels.backend=eager", f"train.steps={STEPS}", "train.eval_interval=1000", "logging.progress_bar=false",
          "train.callbacks=[]")
# activations dominate: 4 blocks of width 256 over micro-batches of 8 x 512 tokens
SHAPE = ("model.num_layers=4", "model.hidden_size=256", "model.ffn_hidden_size=688", "model.num_heads=4",
         "model.seq_length=512", "train.micro_batch_size=8", "train.precision=fp32", "data.eval_samples=8") + COMMON
# parameters dominate: 4 blocks of width 768 (7.1M parameters a block) over micro-batches of 2 x 16 tokens
PARAMS = ("model.num_layers=4", "model.hidden_size=768", "model.ffn_hidden_size=2048", "model.num_heads=4",
          "model.seq_length=16", "train.micro_batch_size=2", "train.precision=fp32", "data.eval_samples=4") + COMMON
# the runtime's fixed cost: one block of width 64 a stage, one micro-batch of 16 tokens
RUNTIME = ("model.hidden_size=64", "model.ffn_hidden_size=160", "model.num_heads=4", "model.seq_length=16",
           "train.micro_batch_size=1", "data.eval_samples=4") + COMMON
# name: (processes, the shape, its overrides)
CASES = {
    "swiglu, rope": (1, SHAPE, ()),
    "swiglu, rope, recompute": (1, SHAPE, ("model.recompute=block",)),
    "gelu, learned positions": (1, SHAPE, ("model.mlp=gelu", "model.position=learned")),
    "post-LN, layernorm": (1, SHAPE, ("model.norm_layout=post", "model.norm=layernorm")),
    "deepnorm": (1, SHAPE, ("model.norm_layout=deepnorm", "model.init=deepnorm")),
    "8 blocks, micro-batch 4": (1, SHAPE, ("model.num_layers=8", "train.micro_batch_size=4")),
    "8 blocks, micro-batch 4, recompute": (1, SHAPE, ("model.num_layers=8", "train.micro_batch_size=4",
                                                      "model.recompute=block")),
    "bf16": (1, SHAPE, ("train.precision=bf16",)),
    "tp2": (2, SHAPE, ("parallel.tp=2",)),
    "pp2, 2 micro-batches in flight": (2, SHAPE, ("parallel.pp=2", "train.micro_batch_size=4", "train.grad_accum=2")),
    "parameters, fp32": (1, PARAMS, ()),
    "parameters, bf16": (1, PARAMS, ("train.precision=bf16",)),
    "parameters, fp32, dp2 ZeRO-1": (2, PARAMS, ("train.micro_batch_size=1",)),
    "parameters, bf16, dp2 ZeRO-1": (2, PARAMS, ("train.micro_batch_size=1", "train.precision=bf16")),
    "parameters, fp32, ZeRO-0": (1, PARAMS, ("parallel.zero_stage=0",)),
    "parameters, bf16, ZeRO-0": (1, PARAMS, ("parallel.zero_stage=0", "train.precision=bf16")),
}
# on one GPU: 8 blocks of the paper's width (512, FFN 1368, 8 heads) over 4 x 1024 tokens, bf16, triton kernels
GPU = ("model.num_layers=8", "model.hidden_size=512", "model.ffn_hidden_size=1368", "model.num_heads=8",
       "model.seq_length=1024", "train.micro_batch_size=4", "train.precision=bf16", "data.eval_samples=4",
       "kernels.backend=triton", f"train.steps={STEPS}", "train.eval_interval=1000", "logging.progress_bar=false",
       "train.callbacks=[]")
GPU_CASES = {"bf16": (), "bf16, recompute": ("model.recompute=block",)}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure_here(overrides: tuple[str, ...]) -> dict:
    """In this process (one rank of a launch): build the trainer and run the steps; the peak above the
    start, and the plan of this rank's stage."""
    from prores.config import load_config
    from prores.data.tokenizers import load_tokenizer
    from prores.launcher.train import Trainer
    from prores.parallel import topology
    from prores.parallel.plan import Layout, stages

    import torch

    cfg = load_config(None, overrides)
    topo = topology.init(cfg.parallel.tp, cfg.parallel.pp)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        start = _status_kib("VmRSS") * 1024
    with tempfile.TemporaryDirectory() as run_dir:
        # every rank in one directory, as a run has it (rank 0 makes the shared caches)
        shared = Path(os.environ.get("MEMORY_RUN_DIR", run_dir))
        trainer = Trainer(cfg, shared, resume=False)
        for _ in range(STEPS):
            trainer.train_step()
        peak = torch.cuda.max_memory_allocated() if cuda else _status_kib("VmHWM") * 1024
    layout = Layout(topo.tp, topo.pp, topo.dp, cfg.train.micro_batch_size, cfg.train.grad_accum, cfg.model.recompute)
    planned = stages(cfg, load_tokenizer(cfg.data.tokenizer).vocab_size, layout,
                     device="cuda" if cuda else "cpu")[topo.pp_rank]
    return {"rank": topo.rank, "measured": peak - start, "planned": planned.peak,
            "activations": planned.activations if cfg.model.recompute == "none" else planned.recomputed}


def measure(processes: int, overrides: tuple[str, ...]) -> list[dict]:
    """:func:`measure_here` in fresh processes: one, or ``processes`` under torchrun; a result per rank."""
    from prores.parallel.rendezvous import own_world

    env = own_world(os.environ)  # a world of its own, not the caller's
    env.update(MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=str(max(1, 2 // processes)))
    import torch

    if not torch.cuda.is_available():
        env["DS_ACCELERATOR"] = "cpu"
    with tempfile.TemporaryDirectory() as run_dir, tempfile.TemporaryDirectory() as out:
        env.update(MEMORY_RUN_DIR=run_dir, MEMORY_OUT=out)
        launch = [sys.executable] if processes == 1 else [
            "torchrun", "--standalone", f"--nproc_per_node={processes}"]
        proc = subprocess.run([*launch, __file__, "--one", *overrides], capture_output=True, text=True, env=env,
                              timeout=900)
        if proc.returncode:
            raise RuntimeError(f"memory measurement failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        results = [json.loads(p.read_text()) for p in Path(out).glob("rank*.json")]
    return sorted(results, key=lambda r: r["rank"])


@functools.lru_cache(maxsize=None)
def runtime_cost(processes: int = 1, pp: int = 1) -> list[int]:
    """Per rank: bytes of the peak that are the runtime's, not the model's (one block a stage)."""
    layout = (f"model.num_layers={pp}", f"parallel.pp={pp}")
    return [r["measured"] - r["planned"] for r in measure(processes, RUNTIME + layout)]


def case(name: str) -> list[dict]:
    """Each rank's measured peak above the runtime's cost, and its plan."""
    processes, shape, extra = CASES[name]
    overrides = shape + extra
    pp = next((int(o.split("=")[1]) for o in extra if o.startswith("parallel.pp=")), 1)
    fixed = runtime_cost(processes, pp)
    return [r | {"runtime": f, "above": r["measured"] - f} for r, f in zip(measure(processes, overrides), fixed)]


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        result = measure_here(tuple(sys.argv[2:]))
        out = os.environ.get("MEMORY_OUT")
        if out:  # ranks under a launcher share stdout: each writes a file of its own
            Path(out, f"rank{result['rank']}.json").write_text(json.dumps(result))
        else:
            print(json.dumps(result), flush=True)
        return
    mib = 2**20
    if sys.argv[1:2] == ["--cuda"]:
        print("| case (one GPU, nothing subtracted) | measured peak (MiB) | planned (MiB) | planned / measured |")
        print("| --- | ---: | ---: | ---: |")
        for name, extra in GPU_CASES.items():
            r = measure(1, GPU + extra)[0]
            print(f"| {name} | {r['measured'] / mib:.0f} | {r['planned'] / mib:.0f} | {r['planned'] / r['measured']:.2f} |",
                  flush=True)
        return
    print("| case | rank | measured peak (MiB) | the runtime's | less the runtime's | planned (MiB) | planned / measured |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    results = {}
    for name in CASES:
        for r in case(name):
            results[(name, r["rank"])] = r
            print(f"| {name} | {r['rank']} | {r['measured'] / mib:.0f} | {r['runtime'] / mib:.0f} |"
                  f" {r['above'] / mib:.0f} | {r['planned'] / mib:.0f} | {r['planned'] / r['above']:.2f} |", flush=True)
    for a, b in (("swiglu, rope", "swiglu, rope, recompute"),
                 ("8 blocks, micro-batch 4", "8 blocks, micro-batch 4, recompute")):
        print(f"peak with recompute / without, {a}: {results[(b, 0)]['measured'] / results[(a, 0)]['measured']:.2f}"
              f" measured, {results[(b, 0)]['planned'] / results[(a, 0)]['planned']:.2f} planned")


if __name__ == "__main__":
    main()
