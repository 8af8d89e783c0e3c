"""Where a training step's time goes: matmuls, attention and the rest (element-wise work, norms, the optimizer,
Python), in ms a step and as shares, for each kernels.backend, at the study's shape (goal: matmuls plus
attention at least 75% of the step).

Each (depth, backend) runs in its own process: ``prores train``'s step (:meth:`Trainer.step_once`, its
callbacks included) warmed up for ``--warmup`` steps (compilation), then ``--windows`` windows of ``--steps``
steps under ``torch.profiler``, each between two windows of as many steps without it. Matmuls are the self time
of the matrix-product ops (``aten::mm``, ``addmm``, ``bmm`` and oneDNN's linear), attention that of SDPA's
kernels forward and backward, in the profiled windows. The step is the median unprofiled window's: the profiler
records every op it sees, which slows a step of many small ops most (eager's), and all of that would count as
the rest. The rest is that step less the matmuls and attention, so what no op records
(Python, Inductor's generated kernels) counts there too; the profiled step is printed beside it.

    python benchmarks/profile_step.py [--depths 48 120] [--backends eager block] [--steps 5] [--windows 3]
                                      [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from _harness import benchmark_trainer, machine

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_mm", "mkldnn::_linear_pointwise")
ATTENTION = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")


def split(events) -> dict[str, float]:
    """Microseconds of matmuls and attention in the profiled steps."""
    return {"matmul": sum(e.self_cpu_time_total for e in events if e.key in MATMUL),
            "attention": sum(e.self_cpu_time_total for e in events if any(a in e.key for a in ATTENTION))}


def one(depth: int, backend: str, steps: int, warmup: int, windows: int, config: str, sets: list[str]) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    _, trainer = benchmark_trainer(config, f"model.num_layers={depth}", f"kernels.backend={backend}", *sets)
    trainer.call("on_start")
    for _ in range(warmup):
        trainer.step_once()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])

    def window() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            trainer.step_once()
        return (time.perf_counter() - start) / steps * 1e3

    plain, profiled, ops = [window()], [], {"matmul": 0.0, "attention": 0.0}
    for _ in range(windows):
        with profile(activities=activities) as prof:
            profiled.append(window())
        for k, us in split(prof.key_averages()).items():
            ops[k] += us / (steps * windows) / 1e3
        plain.append(window())
    step = statistics.median(plain)
    return {"depth": depth, "backend": trainer.backend, "step_ms": step, "profiled_ms": statistics.median(profiled),
            **ops, "rest": step - ops["matmul"] - ops["attention"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[48, 120])
    parser.add_argument("--backends", nargs="+", default=["eager", "block"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--windows", type=int, default=3, help="profiled windows, each between two unprofiled")
    parser.add_argument("--config", default="cpu-depth.yaml")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--one", nargs=2, metavar=("DEPTH", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1], args.steps, args.warmup, args.windows, args.config,
                            args.set)))
        return
    print(f"{args.config} {' '.join(args.set)}: after {args.warmup} steps, {args.windows} windows of {args.steps}"
          f" profiled steps between {args.windows + 1} of {args.steps} unprofiled on {machine()}; ms a step (share of"
          " the unprofiled step)")
    for depth in args.depths:
        for backend in args.backends:
            cmd = [sys.executable, __file__, "--one", str(depth), backend, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--windows", str(args.windows), "--config", args.config,
                   *[a for s in args.set for a in ("--set", s)]]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                print(f"{depth} blocks, kernels {backend}: failed\n{proc.stderr[-2000:]}")
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            share = lambda k: f"{r[k]:.1f} ({r[k] / r['step_ms']:.0%})"  # noqa: E731
            print(f"{depth} blocks, kernels {r['backend']}: step {r['step_ms']:.1f} (profiled {r['profiled_ms']:.1f});"
                  f" matmul {share('matmul')},"
                  f" attention {share('attention')}, rest {share('rest')}; matmul + attention"
                  f" {(r['matmul'] + r['attention']) / r['step_ms']:.0%}")


if __name__ == "__main__":
    main()
