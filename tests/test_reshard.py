"""A checkpoint resumed on another tp × pp × dp (prores.parallel.reshard): weights, both Adam moments, the
step, the data position and the schedules carry over, so the losses after the resume are a straight run's
up to the order of the sums (the parity set's tolerance). A resume on the same layout stays bitwise
(tests/test_resume.py)."""

import signal
import shutil
import time

import psutil
import pytest

from conftest import child_env, cli_command, run_cli, torchrun
from test_resume import manifest, scalars

pytestmark = pytest.mark.slow

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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A straight 1-process run, and a tp2 × pp2 run stopped by SIGTERM (every rank, as Slurm's preemption
    does) after its step-4 checkpoint: its stop checkpoint is the one each test resumes elsewhere."""
    tmp = tmp_path_factory.mktemp("reshard")
    proc = train(tmp / "straight", "tp1-pp1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    launcher, overrides = LAYOUTS["tp2-pp2"]
    args = ["train", "--run-dir", str(tmp / "stopped"), *[a for o in CONFIG + overrides for a in ("--set", o)]]
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
    stopped = max(int(p.parent.name.removeprefix("global_step")) for p in (tmp / "stopped").glob("checkpoints/*/manifest.json"))
    assert 4 <= stopped < STEPS, "the run ended before it could be stopped"
    return tmp, stopped


def assert_continues_the_straight_run(run_dir, straight, since):
    got, want = scalars(run_dir)["train/loss"], scalars(straight)["train/loss"]
    assert sorted(got) == list(range(STEPS))
    for step in range(since, STEPS):
        assert got[step] == pytest.approx(want[step], rel=RTOL), step
    assert scalars(run_dir)["train/samples"][STEPS - 1] == STEPS * 4  # the data position carried over
    valid = scalars(run_dir)["valid/loss"]
    assert valid[STEPS] == pytest.approx(scalars(straight)["valid/loss"][STEPS], rel=RTOL)


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
    assert "a resume on another tp or pp reads the ZeRO optimizer shards, and this run has parallel.zero_stage=0" \
        in proc.stderr
    proc = train(run, "tp1-pp1", "model.num_heads=4", timeout=300)
    assert proc.returncode != 0 and "holds a different model (model.num_heads: 2 -> 4)" in proc.stderr
