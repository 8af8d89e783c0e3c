"""Every script in benchmarks/ runs: one tiny run each, with its smallest arguments, that must end well and
print its figures. A benchmark measures nothing here (its numbers come from a quiet machine); this only
keeps a refactor from breaking one silently."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import child_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TINY = ("model.num_layers=2", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_heads=2",
        "model.seq_length=32", "train.micro_batch_size=2", "data.eval_samples=16", "kernels.backend=eager")
SETS = [a for o in TINY for a in ("--set", o)]
NUMBER = r"[\d.]+"

# script -> (arguments, what its output must show)
SMOKE = {
    "data_loader.py": (["--steps", "2", *SETS], rf"step {NUMBER} ms, data {NUMBER} ms, data share"),
    "fp32_residual.py": (["--layers", "4", "--T", "2", "--steps", "4", *SETS], r"survival|fp32"),
    "fused_norm.py": (["--quick", "--reps", "1", "--gain"], r"GB/s|gain"),
    "monitor_overhead.py": (["--blocks", "2", "--layers", "2", "3", *SETS],
                            rf"ratio on/off {NUMBER}.*\n.*own hooks, on blocks: scalars {NUMBER}, spikes {NUMBER},"
                            rf" layer_stats {NUMBER}, heatmaps {NUMBER}"),
    "overhead.py": (["--blocks", "2", "--steps", "2", *SETS],
                    rf"prores / bare = {NUMBER}.*\n.*ReduceGrads {NUMBER}.*; bare loop: forward {NUMBER}"),
    "parallel_layouts.py": (["--steps", "2", "--layouts", "1,1,1", "1,1,2", "--micro-batches", "1", *SETS],
                            rf"\(1,1,2\)\s+{NUMBER}\s+{NUMBER}x"),
    "peer.py": (["--blocks", "2", "--steps", "1", "--config", "tiny.yaml", *SETS, "--set", "prores.schedule=linear"],
                rf"prores / HF = {NUMBER} \({NUMBER} to {NUMBER}\)"),
    "profile_step.py": (["--depths", "2", "--backends", "eager", "block", "--steps", "1", "--warmup", "1",
                         "--config", "tiny.yaml", *SETS[:-2]],
                        rf"2 blocks, kernels block: step {NUMBER} \(profiled {NUMBER}\); matmul {NUMBER} \({NUMBER}%\)"),
    "preprocess.py": (["--mb", "0.1"], rf"MB/s: 1 worker {NUMBER}, 2 workers {NUMBER}, ratio {NUMBER}"),
    "reshard.py": (["--widths", "32", "--set", "model.num_heads=2", "--set", "model.seq_length=16"],
                   rf"^\s+32\s+[\d,]+\s+{NUMBER}"),
    "roofline.py": (["--widths", "32", "--depths", "2", "--steps", "2", "--reps", "2", *SETS],
                    rf"^\s+2\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}%"),
    "speedup.py": (["--blocks", "2", "--steps", "1", "--config", "tiny.yaml", *SETS[:-2]],
                   rf"fast / eager = {NUMBER} \({NUMBER} to {NUMBER}\)"),
    "study_time.sh": (["{tmp}", "--set", "train.steps=2", *SETS[2:]],
                      rf"in grid order {NUMBER} h, longest first \(the runner's order\) {NUMBER} h"),
}
# study_time.sh's fewest cells: two depths (a line's fit), eager and one compiling backend
SMOKE_ENV = {"study_time.sh": {"BACKENDS": "eager block", "DEPTHS": "2 3"}}
# covered elsewhere: chaos.py by tests/test_chaos.py (its short run), memory.py by tests/test_plan.py (the
# planner against it); gpu_check.sh needs a CUDA device, so here it must stop at once, saying so
ELSEWHERE = {"chaos.py": "test_chaos.py", "memory.py": "test_plan.py", "gpu_check.sh": "this file",
             "gpu_check.py": "this file"}


def test_every_benchmark_has_a_smoke_test():
    scripts = {p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh")
               and not p.name.startswith("_")}  # _harness.py: what the step benchmarks share
    assert scripts == set(SMOKE) | set(ELSEWHERE), scripts ^ (set(SMOKE) | set(ELSEWHERE))
    for script, test in ELSEWHERE.items():
        assert test == "this file" or f"benchmarks/{script}" in (ROOT / "tests" / test).read_text(), script


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_the_benchmark_runs_and_prints_its_figures(script, tmp_path):
    args, shows = SMOKE[script]
    runner = ["bash"] if script.endswith(".sh") else [sys.executable]
    proc = subprocess.run([*runner, str(ROOT / "benchmarks" / script), *[a.format(tmp=tmp_path) for a in args]],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900,
                          env=child_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                                        **SMOKE_ENV.get(script, {})))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert re.search(shows, proc.stdout, re.M), proc.stdout[-3000:]


def test_the_gpu_check_stops_at_once_without_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: benchmarks/gpu_check.sh is the real thing, minutes long")
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=child_env())
    assert proc.returncode != 0 and "no CUDA device" in proc.stderr


def test_the_gpu_checks_plan_lists_every_step_with_its_criterion_and_fits_eight_minutes():
    """`--plan` needs no GPU; it prints the steps the script runs (one registry, benchmarks/gpu_check.py's
    STEPS), each with a function and a criterion, and their limits add up to at most 8 minutes."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--plan"], capture_output=True,
                          text=True, timeout=60, env=child_env())
    assert proc.returncode == 0, proc.stderr
    names = [s.name for s in gpu_check.STEPS]
    assert names == ["nccl", "kernels", "bandwidth", "train", "resume", "mfu", "planner"]
    for i, s in enumerate(gpu_check.STEPS, 1):
        assert f"{i}. {s.name} (at most {s.limit_s} s): {s.does}\n   passes when {s.passes}" in proc.stdout
        assert callable(getattr(gpu_check, f"step_{s.name}"))
    assert sum(s.limit_s for s in gpu_check.STEPS) <= 8 * 60
