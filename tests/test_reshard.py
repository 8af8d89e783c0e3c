"""A checkpoint resumed on another tp × pp × dp (prores.parallel.reshard): weights, both Adam moments, the
step, the data position and the schedules carry over, so the losses after the resume are a straight run's
up to the order of the sums (the parity set's tolerance). A resume on the same layout stays bitwise
(tests/test_resume.py)."""

import json
import signal
import shutil
import time
from pathlib import Path

import psutil
import pytest

from conftest import NO_SLURM, child_env, cli_command, need, run_cli, slurm_available, torchrun
from test_parallel import BF16_LOSS_RTOL
from test_resume import manifest, preempted_sbatch_job, scalars

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

STEPS = 12
CONFIG = ("model.num_layers=4", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_heads=2",
          "model.seq_length=32", "train.micro_batch_size=4", f"train.steps={STEPS}", "train.log_interval=1",
          "train.eval_interval=6", "data.eval_samples=16", "checkpoint.interval=4", "kernels.backend=eager",
          "optim.warmup_steps=2", "logging.progress_bar=false")
# the global batch stays 4 samples: dp2 halves the micro-batch
LAYOUTS = {"tp1-pp1": (None, ()), "tp2-pp2": (torchrun(4), ("parallel.tp=2", "parallel.pp=2")),
           "pp4": (torchrun(4), ("parallel.pp=4",)),
           "dp2-pp2": (torchrun(4), ("parallel.pp=2", "train.micro_batch_size=2"))}
# the parity set's: reduction order only (fp32, a dozen steps of a tiny model)
RTOL = 1e-4


def train(run_dir, layout, *extra, timeout=900):
    launcher, overrides = LAYOUTS[layout]
    args = ["train", "--run-dir", str(run_dir), *[a for o in CONFIG + overrides + extra for a in ("--set", o)]]
    return run_cli(*args, launcher=launcher, timeout=timeout)


def straight_and_stopped(tmp, extra=(), stopped_extra=()):
    """A straight 1-process run, and a tp2 × pp2 run stopped by SIGTERM (every rank, as Slurm's preemption
    does) after its step-4 checkpoint: its stop checkpoint is the one the tests resume elsewhere."""
    proc = train(tmp / "straight", "tp1-pp1", *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    launcher, overrides = LAYOUTS["tp2-pp2"]
    args = ["train", "--run-dir", str(tmp / "stopped"),
            *[a for o in CONFIG + overrides + extra + stopped_extra for a in ("--set", o)]]
    with open(tmp / "stopped.log", "w") as log:
        proc = psutil.Popen(cli_command(*args, launcher=launcher), stdout=log, stderr=log, env=child_env(),
                            start_new_session=True)
        deadline = time.monotonic() + 600
        while not manifest(tmp / "stopped", 4).exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp / "stopped.log").read_text()[-3000:]
            time.sleep(0.05)
        for worker in proc.children(recursive=True):
            if worker.environ().get("RANK") is not None:
                worker.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=600) == 0, (tmp / "stopped.log").read_text()[-3000:]
    stopped = max(int(p.parent.name.removeprefix("global_step"))
                  for p in (tmp / "stopped").glob("checkpoints/*/manifest.json"))
    assert 4 <= stopped < STEPS, "the run ended before it could be stopped"
    return tmp, stopped


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return straight_and_stopped(tmp_path_factory.mktemp("reshard"))


def assert_continues_the_straight_run(run_dir, straight, since, rtol=RTOL):
    got, want = scalars(run_dir)["train/loss"], scalars(straight)["train/loss"]
    assert sorted(got) == list(range(STEPS))
    for step in range(since, STEPS):
        assert got[step] == pytest.approx(want[step], rel=rtol), step
    assert scalars(run_dir)["train/samples"][STEPS - 1] == STEPS * 4  # the data position carried over
    valid = scalars(run_dir)["valid/loss"]
    assert valid[STEPS] == pytest.approx(scalars(straight)["valid/loss"][STEPS], rel=rtol)


@pytest.mark.parametrize("layout", ["tp1-pp1", "pp4", "dp2-pp2"])
def test_a_tp2_pp2_checkpoint_resumes_on_another_layout(runs, layout, tmp_path):
    tmp, stopped = runs
    run = tmp_path / "run"
    shutil.copytree(tmp / "stopped", run)
    proc = train(run, layout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tp, pp, dp = {"tp1-pp1": (1, 1, 1), "pp4": (1, 4, 1), "dp2-pp2": (1, 2, 2)}[layout]
    assert (f"resuming step {stopped} from tp2 x pp2 x dp1 on tp{tp} x pp{pp} x dp{dp}:"
            f" {run}/checkpoints/global_step{stopped}") in proc.stdout
    assert_continues_the_straight_run(run, tmp / "straight", stopped)


def test_a_one_process_checkpoint_resumes_on_tp2_pp2(runs, tmp_path):
    tmp, _ = runs
    run = tmp_path / "run"
    shutil.copytree(tmp / "straight", run)
    shutil.rmtree(run / "checkpoints" / f"global_step{STEPS}")  # the 8th is the newest then
    (run / "summary.json").unlink()
    proc = train(run, "tp2-pp2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming step 8 from tp1 x pp1 x dp1 on tp2 x pp2 x dp1" in proc.stdout
    assert_continues_the_straight_run(run, tmp / "straight", 8)


def test_what_cannot_work_is_refused_with_its_reason(runs, tmp_path):
    tmp, _ = runs
    run = tmp_path / "run"
    shutil.copytree(tmp / "stopped", run)
    proc = train(run, "tp1-pp1", "parallel.zero_stage=0", timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert ("cannot be resumed exactly here (parallel.zero_stage 1 -> 0; parallel.tp 2 -> 1; parallel.pp 2 -> 1)"
            in proc.stderr)
    proc = train(run, "tp1-pp1", "model.num_heads=4", timeout=300)
    assert proc.returncode != 0 and "holds a different model (model.num_heads: 2 -> 4)" in proc.stderr


# tied embeddings (the head on the last stage shares the first stage's), a residual method with its own gains,
# uneven stages, bf16 with ZeRO-1
HARD = ("model.tie_embeddings=true", "model.norm_layout=layerscale", "model.layerscale_init=0.1",
        "train.precision=bf16", "model.fp32_residual=false")


def test_tied_layerscale_uneven_bf16_resumes_on_other_stages_and_dp(tmp_path_factory, tmp_path):
    """Resumed on dp2 × pp2 split [3, 1]: the parity set's bf16 tolerance against one bf16 process (the layouts
    round their partial sums to bf16 in different places)."""
    tmp, stopped = straight_and_stopped(tmp_path_factory.mktemp("hard"), HARD, ("parallel.stage_layers=[1, 3]",))
    run = tmp_path / "run"
    shutil.copytree(tmp / "stopped", run)
    proc = train(run, "dp2-pp2", *HARD, "parallel.stage_layers=[3, 1]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming step {stopped} from tp2 x pp2 x dp1 on tp1 x pp2 x dp2" in proc.stdout
    assert_continues_the_straight_run(run, tmp / "straight", stopped, rtol=BF16_LOSS_RTOL)


def test_a_requeued_slurm_job_resumes_on_the_nodes_it_comes_back_with(runs, tmp_path):
    """slurm/train.sbatch on 1 node x 2 tasks with a fixed train.global_batch_size; SIGUSR1 -> save and
    requeue; while it waits, the job is given 2 nodes (4 tasks): it resumes on dp 4, its accumulation
    halved, and ends at the straight run's loss."""
    need(slurm_available(), NO_SLURM)
    tmp, _ = runs
    args = [a for o in CONFIG + ("train.global_batch_size=4", "train.micro_batch_size=1") for a in ("--set", o)]
    out, _ = preempted_sbatch_job(tmp_path, ["--nodes=1", "--ntasks-per-node=2"], args, checkpoint_step=4,
                                  while_requeued=("NumNodes=2-2", "NumTasks=4"))
    assert "(restart 1)" in out and "from tp1 x pp1 x dp2 on tp1 x pp1 x dp4" in out, out[-3000:]
    final = json.loads((tmp_path / "run" / "summary.json").read_text())["final_valid_loss"]
    want = json.loads((tmp / "straight" / "summary.json").read_text())["final_valid_loss"]
    assert final == pytest.approx(want, rel=RTOL)
