"""The GPU check's steps, each with its pass criterion, decided before any GPU ran them (issue 39).

    python benchmarks/gpu_check.py --plan             # the steps and criteria; no GPU needed
    python benchmarks/gpu_check.py OUT_DIR            # every step, each in a process of its own under its time
                                                      # limit; OUT_DIR/summary.json and OUT_DIR/gpu_check.txt
    python benchmarks/gpu_check.py --step NAME OUT    # one step (what the driver runs)

benchmarks/gpu_check.sh installs the carried wheels and runs this. A step that fails, hangs or crashes is
recorded as such and the next one runs. Each step writes OUT/NAME.json: its figure, its verdict, the detail.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIN_MFU = 0.30  # of the measured bf16 matmul rate, for the 1.3b config at tp 1: below is a slow path to find
MIN_BANDWIDTH = 0.60  # of the device's copy rate, for the fused add + norm on 256 MiB tensors
PLAN_WITHIN = 0.15  # planned / measured peak within 1 ± this
TAU = {"torch.float32": 1e-5, "torch.bfloat16": 1.6e-2}  # tests/test_fused.py's normwise bounds
SAME_LOSS = 0.02  # nats: triton vs eager kernels after a short bf16 run (different rounding, same model)


@dataclass(frozen=True)
class Step:
    name: str
    limit_s: int
    does: str
    passes: str  # the criterion, as the plan prints it


STEPS = [
    Step("nccl", 45, "an NCCL world of one: an all-reduce over every Megatron group, and count_parameters of a"
                     " model built on the GPU", "every collective returns; the count equals the pieces' numel"),
    Step("kernels", 60, "the Triton add + norm kernels against float64, widths 64 to 8192 (odd ones too), odd row"
                        " counts, fp32 / bf16 / fp32 stream with a bf16 branch, alpha None, 0, 1e-3 and 1,"
                        " with and without gains, rmsnorm and layernorm",
         "every output's largest error is within the suite's normwise bound (tests/test_fused.py: 1e-5 of the"
         " largest reference value in fp32, 1.6e-2 in bf16)"),
    Step("bandwidth", 45, "the fused add + norm with triton.testing.do_bench on 256 MiB tensors, against the device's"
                          " copy rate (the eager path beside it)",
         f"the fused kernel moves at least {MIN_BANDWIDTH:.0%} of the copy rate's bytes a second"),
    Step("train", 120, "a 24-block bf16 run of 80 steps past its warmup (20): triton kernels, then eager, then"
                       " triton with model.recompute=block",
         f"the loss falls below the unigram entropy; eager ends within {SAME_LOSS} nats of triton; recompute"
         " logs the same losses as without, to bf16 rounding (1e-2 relative)"),
    Step("resume", 60, "a 20-step run, and the same run resumed from its step-10 checkpoint",
         "the resumed steps log the straight run's losses exactly"),
    Step("mfu", 75, "the 1.3b config in bf16 at tp 1 for 12 steps, its steady tokens/s times its FLOPs per token,"
                    " against the measured rate of a 8192^3 bf16 matmul",
         f"the MFU is at least {MIN_MFU:.0%}"),
    Step("planner", 75, "prores plan's peak against torch.cuda.max_memory_allocated (benchmarks/memory.py --cuda),"
                         " recompute off and on", f"planned / measured is within 1 ± {PLAN_WITHIN} in both"),
]
TOTAL_S = sum(s.limit_s for s in STEPS)  # at most 8 minutes: the GPU machine lends 15 in all, start-up included


def plan() -> str:
    lines = [f"benchmarks/gpu_check.sh: {len(STEPS)} steps, at most {TOTAL_S} s in all", ""]
    for i, s in enumerate(STEPS, 1):
        lines += [f"{i}. {s.name} (at most {s.limit_s} s): {s.does}", f"   passes when {s.passes}"]
    return "\n".join(lines)


# ---- the steps: each returns (figure, ok, detail)

def train_run(run_dir: Path, *sets: str, config: str = "depth/24.yaml", launch: bool = True) -> dict:
    args = ["train", config, "--run-dir", str(run_dir), "--set", "logging.progress_bar=false",
            "--set", "train.log_interval=1"]
    for s in sets:
        args += ["--set", s]
    cmd = ["torchrun", "--standalone", "--nproc-per-node", "1", "-m", "prores", *args] if launch else [
        sys.executable, "-m", "prores", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"prores train failed ({proc.returncode}):\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    from prores.monitor.tensorboard import read_scalars

    summary = json.loads((run_dir / "summary.json").read_text())
    return {"summary": summary, "loss": read_scalars(run_dir, lambda t: t == "train/loss")["train/loss"]}


def step_nccl(out: Path):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from prores.config import load_config
    from prores.launcher.builders import build_model
    from prores.parallel import topology
    from prores.parallel.grad_norm import count_parameters

    topo = topology.init(1, 1)
    groups = {"tp": ps.get_tensor_model_parallel_group(), "pp": ps.get_pipeline_model_parallel_group(),
              "dp": ps.get_data_parallel_group(), "mp": ps.get_model_parallel_group(),
              "embedding": ps.get_embedding_group()}
    for name, group in groups.items():
        t = torch.ones(3, device=topo.device)
        dist.all_reduce(t, group=group)
        assert t.tolist() == [1.0] * 3, name
    cfg = load_config(None, ("kernels.backend=triton",))
    model = build_model(cfg, topo, 384, topo.device)
    params = list(model.module.parameters())
    counted = count_parameters(params, 0, ps.get_model_parallel_group())
    want = sum(p.numel() for p in params)
    return counted, counted == want, f"{len(groups)} groups all-reduced on {topo.device}; {counted} of {want} parameters"


def step_kernels(out: Path):
    import torch

    from prores.model.kernels import reference, triton_ops

    worst, cases, failed = 0.0, 0, []
    for rms in (True, False):
        for width in (64, 96, 1000, 4096, 8192):
            for rows in (1, 7, 513):
                for stream, branch in ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                       (torch.float32, torch.bfloat16)):
                    for alpha in (None, 0.0, 1e-3, 1.0):
                        for gain in (False, True):
                            g = torch.Generator(device="cuda").manual_seed(cases)
                            x = torch.randn(rows, width, device="cuda", generator=g).to(stream)
                            f = torch.randn(rows, width, device="cuda", generator=g).to(branch)
                            w = (1 + 0.1 * torch.randn(width, device="cuda", generator=g)).to(stream)
                            b = None if rms else (0.1 * torch.randn(width, device="cuda", generator=g)).to(stream)
                            a = None if alpha is None else torch.tensor(alpha, device="cuda")
                            k = (0.5 + torch.rand(width, device="cuda", generator=g)).to(branch) if gain else None
                            got = triton_ops.add_norm(x, f, a, w, b, 1e-5, rms, k)
                            up = [None if t is None else t.double() for t in (x, f, a, w, b, k)]
                            want = reference.add_norm(up[0], up[1], up[2], up[3], up[4], 1e-5, rms, up[5])
                            for o, r in zip(got, want):
                                err = (o.double() - r).abs().max().item() / (TAU[str(o.dtype)] * r.abs().max().item())
                                worst = max(worst, err)
                                if err > 1:
                                    failed.append(f"{'rms' if rms else 'ln'} w{width} r{rows} {stream}/{branch}"
                                                  f" alpha={alpha} gain={gain}: {err:.2f} of the bound")
                            cases += 1
    return worst, not failed, f"{cases} cases, worst error {worst:.2f} of the bound" + (
        f"; failed: {failed[:5]}" if failed else "")


def step_bandwidth(out: Path):
    import torch
    from triton.testing import do_bench

    from prores.model.kernels import reference, triton_ops

    rows, width = 16384, 4096  # 256 MiB a tensor in fp32
    x, f = (torch.randn(rows, width, device="cuda") for _ in range(2))
    w, a = torch.ones(width, device="cuda"), torch.tensor(0.5, device="cuda")
    y = torch.empty_like(x)
    nbytes = x.numel() * 4
    copy = 2 * nbytes / do_bench(lambda: y.copy_(x), warmup=25, rep=200) * 1e-6  # GB/s: ms -> s, bytes -> GB
    fused = 4 * nbytes / do_bench(lambda: triton_ops.add_norm(x, f, a, w, None, 1e-5, True), warmup=25,
                                  rep=200) * 1e-6
    eager = 4 * nbytes / do_bench(lambda: reference.add_norm(x, f, a, w, None, 1e-5, True), warmup=25,
                                  rep=200) * 1e-6
    share = fused / copy
    return share, share >= MIN_BANDWIDTH, (f"copy {copy:.0f} GB/s, fused {fused:.0f} GB/s ({share:.0%}), eager"
                                           f" {eager:.0f} GB/s (bytes the fused op must move, per second)")


def step_train(out: Path):
    sets = ("train.steps=100", "optim.warmup_steps=20", "train.eval_interval=100", "train.precision=bf16")
    triton = train_run(out / "train-triton", *sets, "kernels.backend=triton")
    eager = train_run(out / "train-eager", *sets, "kernels.backend=eager")
    recompute = train_run(out / "train-recompute", *sets, "kernels.backend=triton", "model.recompute=block")
    s = triton["summary"]
    learned = s["final_valid_loss"] < s["unigram_entropy"]
    gap = abs(eager["summary"]["final_valid_loss"] - s["final_valid_loss"])
    worst = max(abs(recompute["loss"][k] - v) / abs(v) for k, v in triton["loss"].items())
    ok = learned and gap <= SAME_LOSS and worst <= 1e-2
    return s["final_valid_loss"], ok, (f"valid loss {s['final_valid_loss']:.4f} vs unigram {s['unigram_entropy']:.4f};"
                                       f" eager {eager['summary']['final_valid_loss']:.4f} (gap {gap:.4f});"
                                       f" recompute's losses within {worst:.2e} relative;"
                                       f" {s['steady_tokens_per_sec'] or 0:.0f} tokens/s steady")


def step_resume(out: Path):
    sets = ("train.steps=20", "train.eval_interval=20", "checkpoint.interval=10", "checkpoint.keep_last=0",
            "train.precision=bf16", "kernels.backend=triton")
    straight = train_run(out / "resume-straight", *sets)
    cut = out / "resume-cut"
    shutil.copytree(out / "resume-straight", cut)
    shutil.rmtree(cut / "checkpoints" / "global_step20")
    (cut / "checkpoints" / "latest").write_text("global_step10")
    (cut / "summary.json").unlink()
    resumed = train_run(cut, *sets)
    steps = [k for k in straight["loss"] if k >= 10]
    same = all(resumed["loss"][k] == straight["loss"][k] for k in steps)
    worst = max(abs(resumed["loss"][k] - straight["loss"][k]) for k in steps)
    return worst, same and len(steps) == 10, f"steps 10-19: largest difference {worst:.3e}"


def step_mfu(out: Path):
    import torch
    from triton.testing import do_bench

    from prores.config import load_config
    from prores.data.tokenizers import load_tokenizer
    from prores.model.size import block_flops_per_token, padded_vocab_size

    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    peak = 2 * n**3 / do_bench(lambda: a @ b, warmup=25, rep=200) * 1e-9  # TFLOP/s
    sets = ("train.steps=12", "train.eval_interval=12", "train.precision=bf16", "parallel.tp=1",
            "kernels.backend=triton")
    run = train_run(out / "mfu", *sets, config="1.3b.yaml")
    cfg = load_config("1.3b.yaml", sets)
    m = cfg.model
    head = 3 * 2 * m.hidden_size * padded_vocab_size(load_tokenizer(cfg.data.tokenizer).vocab_size, m.vocab_multiple)
    flops = m.num_layers * block_flops_per_token(m) + head
    rate = run["summary"]["steady_tokens_per_sec"] * flops * 1e-12
    mfu = rate / peak
    return mfu, mfu >= MIN_MFU, f"{rate:.0f} TFLOP/s of {peak:.0f} measured bf16 matmul TFLOP/s"


def step_planner(out: Path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import memory

    ratios = {name: (lambda r: r["planned"] / r["measured"])(memory.measure(1, memory.GPU + extra)[0])
              for name, extra in memory.GPU_CASES.items()}
    worst = max(abs(r - 1) for r in ratios.values())
    return worst, worst <= PLAN_WITHIN, "; ".join(f"{k}: {v:.2f}" for k, v in ratios.items())


# ---- the driver

def run_step(name: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    try:
        figure, ok, detail = globals()[f"step_{name}"](out)
        result = {"figure": figure, "verdict": "pass" if ok else "fail", "detail": detail}
    except Exception as exc:  # a step's crash is its verdict; the driver goes on
        result = {"figure": None, "verdict": "error", "detail": f"{type(exc).__name__}: {exc}"[-3000:]}
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))


def run_all(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    results = {}
    for s in STEPS:
        start = time.monotonic()
        (out / f"{s.name}.json").unlink(missing_ok=True)
        try:
            subprocess.run([sys.executable, __file__, "--step", s.name, str(out)], timeout=s.limit_s,
                           cwd=ROOT, env=os.environ | {"PYTHONUNBUFFERED": "1"})
            path = out / f"{s.name}.json"
            result = json.loads(path.read_text()) if path.is_file() else {
                "figure": None, "verdict": "error", "detail": "the step's process ended without a result"}
        except subprocess.TimeoutExpired:
            result = {"figure": None, "verdict": "timeout", "detail": f"past its {s.limit_s} s"}
        result |= {"seconds": round(time.monotonic() - start, 1), "criterion": s.passes}
        results[s.name] = result
        print(f"{s.name}: {result['verdict']} ({result['detail']})", flush=True)
    passed = sum(r["verdict"] == "pass" for r in results.values())
    summary = {"device": device, "torch": torch.__version__, "passed": passed, "steps": results}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    figure = lambda v: "-" if v is None else f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else str(v)
    text = [f"benchmarks/gpu_check.sh on {device} (torch {torch.__version__}): {passed} of {len(STEPS)} steps pass",
            "", "| step | verdict | figure | seconds | criterion | detail |", "| --- | --- | ---: | ---: | --- | --- |"]
    text += [f"| {n} | {r['verdict']} | {figure(r['figure'])} | {r['seconds']} | {r['criterion']} | {r['detail']} |"
             for n, r in results.items()]
    (out / "gpu_check.txt").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 0 if passed == len(STEPS) else 1


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--plan"]:
        print(plan())
        return 0
    if args[:1] == ["--step"]:
        run_step(args[1], Path(args[2]))
        return 0
    return run_all(Path(args[0] if args else "gpu_check_out"))


if __name__ == "__main__":
    sys.exit(main())
