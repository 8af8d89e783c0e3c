"""Faults nobody announces (issue 26): a hung or dead rank in a pp=2 torchrun job under --max-restarts. The
rank left waiting finds the hang (train.hang_timeout), writes its stacks and exits; torchrun restarts the
workers, which resume from the newest good checkpoint and end with a straight run's losses, bit for bit."""

import json
import re
import shutil
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from conftest import NO_SLURM, PORT, child_env, cli_command, need, run_cli, slurm_available, torchrun, train_args
from prores.monitor.tensorboard import read_scalars
from prores.run.watchdog import EXIT_HUNG

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

STEPS, FAULT_AFTER = 300, 100
HANG_TIMEOUT = 20
CONFIG = ("model.num_layers=4", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.seq_length=32",
          "train.micro_batch_size=4", "data.eval_samples=8", "kernels.backend=eager", f"train.steps={STEPS}",
          "train.log_interval=1", "train.eval_interval=150", "checkpoint.interval=50", "parallel.pp=2",
          "logging.progress_bar=false", "train.hang_timeout_first_step=300", f"train.hang_timeout_eval={HANG_TIMEOUT}",
          f"checkpoint.save_timeout={HANG_TIMEOUT}")  # the fault may strike in a save


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    proc = run_cli(*train_args(run_dir, CONFIG), launcher=torchrun(2), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def worker(launcher: subprocess.Popen, rank: int) -> psutil.Process:
    for p in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if p.environ().get("RANK") == str(rank) and "prores" in " ".join(p.cmdline()):
                return p
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no rank {rank} under the launcher")


def fault_a_rank(tmp_path, sig) -> tuple[Path, subprocess.Popen, float]:
    """Start the job under `torchrun --max-restarts 3`; once its step-100 checkpoint is written, ``sig`` to rank 1."""
    run_dir = tmp_path / "run"
    log = open(tmp_path / "job.log", "w")
    launcher = ["torchrun", "--standalone", "--nproc_per_node=2", "--max-restarts=3", "-m", "prores"]
    job = subprocess.Popen(cli_command(*train_args(run_dir, CONFIG + (f"train.hang_timeout={HANG_TIMEOUT}",)),
                                       launcher=launcher), stdout=log, stderr=subprocess.STDOUT, env=child_env(),
                           start_new_session=True)
    checkpoint = run_dir / "checkpoints" / f"global_step{FAULT_AFTER}" / "manifest.json"
    deadline = time.monotonic() + 600
    while not checkpoint.exists():
        assert job.poll() is None and time.monotonic() < deadline, (tmp_path / "job.log").read_text()[-3000:]
        time.sleep(0.05)
    worker(job, 1).send_signal(sig)
    return run_dir, job, time.monotonic()


def finish(tmp_path, job) -> str:
    try:
        job.wait(timeout=900)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    out = (tmp_path / "job.log").read_text()
    assert job.returncode == 0, out[-4000:]
    return out


def assert_a_straight_runs_losses(run_dir, straight):
    summary, plain = (json.loads((d / "summary.json").read_text()) for d in (run_dir, straight))
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    assert summary["final_valid_loss"] == plain["final_valid_loss"]
    losses = [read_scalars(d, lambda t: t == "train/loss")["train/loss"] for d in (run_dir, straight)]
    assert len(losses[0]) == STEPS and losses[0] == losses[1]
    return summary


def test_a_stopped_rank_is_found_hung_and_the_job_restarts_to_a_straight_runs_losses(straight, tmp_path):
    run_dir, job, stopped = fault_a_rank(tmp_path, signal.SIGSTOP)
    hangs = run_dir / "hangs"
    while not (found := list(hangs.glob("step*-rank0.txt"))):
        assert time.monotonic() - stopped < 60 and job.poll() is None
        time.sleep(0.1)
    detected = time.monotonic() - stopped
    assert detected < 35, f"found after {detected:.0f} s"
    out = finish(tmp_path, job)
    stacks = found[0].read_text()
    step = int(found[0].name.split("-")[0][4:])
    phase = re.search(rf"step {step}, phase (step|save|eval), no progress for", stacks).group(1)
    assert stacks.startswith("rank 0 on ")
    assert "Thread 0x" in stacks and "distributed_c10d.py" in stacks  # the collective it waits in
    assert "prores: error: rank 0 on " in out and f"hung at step {step}: no progress in phase '{phase}' for" in out
    assert f"exiting {EXIT_HUNG}" in out
    summary = assert_a_straight_runs_losses(run_dir, straight)
    assert summary["restarts"] == 1
    [fault] = summary["faults"]
    assert fault["kind"] == "hang" and fault["detected_by_rank"] == 0 and fault["step"] == step
    assert HANG_TIMEOUT <= fault["detect_s"] < 35
    assert fault["resumed_from"] == FAULT_AFTER and fault["steps_lost"] == step - FAULT_AFTER


def test_a_killed_rank_restarts_the_job_to_a_straight_runs_losses(straight, tmp_path):
    run_dir, job, _ = fault_a_rank(tmp_path, signal.SIGKILL)
    finish(tmp_path, job)
    summary = assert_a_straight_runs_losses(run_dir, straight)
    assert summary["restarts"] == 1
    [fault] = summary["faults"]
    # rank 0 fails at once in gloo (a rank lost: the step from RUN/progress.json), or, waiting on the dead peer in
    # a call gloo does not fail, is found hung by its watchdog (the step it hung at)
    assert fault["kind"] in ("rank lost", "hang") and fault["resumed_from"] == FAULT_AFTER
    assert fault["step"] >= FAULT_AFTER and fault["steps_lost"] == fault["step"] - FAULT_AFTER


def write_attempts(run_dir, *entries):
    (run_dir / "attempts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))


def test_the_faults_of_a_run_from_its_attempts_and_records(tmp_path):
    """Four starts: a hang at step 130 (its record), then a clean stop at step 170 (no fault), then a rank lost
    with RUN/progress.json last at step 230; restarts resumed from 100, 170 and 200. By hand: two faults."""
    from prores.run.faults import faults, record_fault

    job = {"job": "TORCHELASTIC_RUN_ID=x", "host": "h"}
    write_attempts(tmp_path, {"event": "start", "time": 10.0, "step": 0, "restart": 0} | job,
                   {"event": "start", "time": 50.0, "step": 100, "restart": 1} | job,
                   {"event": "ended", "start_time": 50.0, "time": 60.0, "status": "stopped", "step": 170},
                   {"event": "start", "time": 70.0, "step": 170, "restart": 0} | job,
                   {"event": "reached", "start_time": 70.0, "step": 230, "time": 80.0},
                   {"event": "start", "time": 95.0, "step": 200, "restart": 1} | job)
    record_fault(tmp_path, {"kind": "hang", "step": 130, "rank": 1, "detect_s": 20.5})
    record = next((tmp_path / "faults").glob("*.json"))
    record.write_text(json.dumps(json.loads(record.read_text()) | {"time": 40.0}))
    assert faults(tmp_path) == [
        {"kind": "hang", "step": 130, "detected_by_rank": 1, "detect_s": 20.5, "resumed_from": 100,
         "steps_lost": 30, "restart": 1, "lost_s": 10.0},
        {"kind": "rank lost", "step": 230, "detected_by_rank": None, "detect_s": None, "resumed_from": 200,
         "steps_lost": 30, "restart": 1, "lost_s": 15.0}]


def test_the_restart_budget_is_a_jobs_and_counts_only_restarts_without_progress(tmp_path, monkeypatch):
    """train.max_restarts_without_progress=2, by hand: a job whose last two starts resumed from step 100 and ended
    unclean is refused; a start that ended cleanly, a newer checkpoint, or a new job starts afresh. A job is named
    by Slurm or torchrun's rendezvous id, never by torchrun's "none" or the shell that ran it."""
    from prores.run.restarts import budget_spent, job_id

    start = lambda t, step, job="slurm job 7": {"event": "start", "time": float(t), "step": step, "job": job}  # noqa
    faulted = [start(0, 0), start(1, 100), start(2, 100)]
    assert re.match(r"2 starts in a row of this job \(slurm job 7\) resumed from step 100 and saved no new"
                    r" checkpoint: stopping instead of looping", budget_spent(faulted, "slurm job 7", 100, 2))
    assert budget_spent(faulted, "slurm job 7", 150, 2) is None  # a new checkpoint since
    assert budget_spent(faulted, "slurm job 8", 100, 2) is None  # a new submission
    assert budget_spent(faulted, "slurm job 7", 100, 3) is None and budget_spent(faulted, "slurm job 7", 100, 0) is None
    clean = faulted + [{"event": "ended", "start_time": 2.0, "status": "stopped", "step": 100}]
    assert budget_spent(clean, "slurm job 7", 100, 2) is None  # a clean end is no fault
    assert budget_spent(clean + [start(3, 100)], "slurm job 7", 100, 2) is None

    for var in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    plain = job_id()
    assert plain.startswith(f"process {os.getpid()} on ")  # each plain start its own job
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun without --rdzv-id
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert job_id().startswith(f"torchrun agent {os.getppid()} on ")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert job_id() == "torchrun run abc"
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert job_id() == "slurm job 42"


def test_a_new_job_after_a_fixed_fault_trains(tmp_path):
    """The run's record holds four starts that resumed from the same step and faulted, each under a torchrun whose
    rendezvous id was "none" (as every torchrun without --rdzv-id or --standalone has): a new torchrun of the same
    run directory, the same way, is another job, and trains to the end."""
    run_dir = tmp_path / "run"
    small = FULL + ("train.steps=20", "checkpoint.keep_last=0", "optim.warmup_steps=2")
    proc = run_cli(*train_args(run_dir, small), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.rmtree(run_dir / "checkpoints" / "global_step20")
    (run_dir / "summary.json").unlink()
    job = {"job": "TORCHELASTIC_RUN_ID=none", "host": "h", "restart": 1}  # what such starts were once keyed on
    write_attempts(run_dir, *({"event": "start", "time": float(t), "step": 10} | job for t in range(4)))
    launcher = ["torchrun", "--nnodes=1", "--nproc_per_node=1", f"--master_port={PORT}", "-m", "prores"]
    proc = run_cli(*train_args(run_dir, small + ("train.max_restarts_without_progress=3",)), launcher=launcher,
                   timeout=600)
    assert proc.returncode == 0 and "resuming from step 10" in proc.stdout, proc.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


def test_a_watchdog_whose_run_directory_cannot_be_written_still_ends_its_hung_rank(tmp_path, small_tmpfs):
    """The run directory on a tmpfs filled to the last byte after the step-100 checkpoint, then rank 1 stopped:
    rank 0's watchdog cannot write its stacks or its fault record, says so, writes the stacks to stderr and exits
    124 within its bound."""
    disk = small_tmpfs(size="96m", inodes=4000)
    run_dir = disk / "run"
    log = open(tmp_path / "job.log", "w")
    job = subprocess.Popen(cli_command(*train_args(run_dir, CONFIG + (f"train.hang_timeout={HANG_TIMEOUT}",)),
                                       launcher=torchrun(2)), stdout=log, stderr=subprocess.STDOUT, env=child_env(),
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not (run_dir / "checkpoints" / f"global_step{FAULT_AFTER}" / "manifest.json").exists():
            assert job.poll() is None and time.monotonic() < deadline, (tmp_path / "job.log").read_text()[-3000:]
            time.sleep(0.05)
        subprocess.run(["dd", "if=/dev/zero", f"of={disk / 'filler'}", "bs=1M"], capture_output=True)
        subprocess.run(["bash", "-c", f"for i in $(seq 4000); do : > {disk}/f$i || break; done"], capture_output=True)
        peer = worker(job, 1)
        peer.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        while f"exiting {EXIT_HUNG}" not in (tmp_path / "job.log").read_text():
            assert time.monotonic() - stopped < 120 and job.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
            time.sleep(0.1)
        took = time.monotonic() - stopped
        peer.send_signal(signal.SIGCONT)  # so that torchrun's SIGTERM reaches it
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    out = (tmp_path / "job.log").read_text()
    assert re.search(r"prores: warning: cannot write \S+hangs/step\d+-rank0\.txt \(No space left on device\)", out), \
        out[-3000:]
    assert re.search(rf"hung at step \d+: no progress in phase '\w+' for \d+ s \(bound {HANG_TIMEOUT} s\); stacks in"
                     rf" stderr; exiting {EXIT_HUNG}", out), out[-3000:]
    assert "Thread 0x" in out and "distributed_c10d.py" in out  # the stacks, on stderr
    assert took < 35, f"rank 0 exited {took:.0f} s after the stop"


FULL = ("model.num_layers=2", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.seq_length=32",
        "train.micro_batch_size=4", "data.eval_samples=8", "kernels.backend=eager", "train.steps=30",
        "train.log_interval=1", "train.eval_interval=30", "checkpoint.interval=10", "checkpoint.keep_last=1",
        "logging.progress_bar=false")


def test_a_save_on_a_full_disk_keeps_the_previous_checkpoint_and_the_run_goes_on(tmp_path, small_tmpfs):
    """RUN/checkpoints on a tmpfs with room for one checkpoint and a half: the step-10 save fits, the step-20 and
    step-30 ones do not (retention removes the old one only after a new one is complete). Each failure is one
    line; the run completes; the step-10 checkpoint is intact, and a run resumed from it ends as a straight one."""
    straight = tmp_path / "straight"
    proc = run_cli(*train_args(straight, FULL), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    size = sum(p.stat().st_size for p in (straight / "checkpoints" / "global_step30").rglob("*") if p.is_file())
    run_dir = tmp_path / "full"
    (run_dir / "checkpoints").mkdir(parents=True)
    disk = small_tmpfs(size=f"{int(size * 1.5) // 1024}k", inodes=1000)
    (run_dir / "checkpoints").rmdir()
    (run_dir / "checkpoints").symlink_to(disk)
    proc = run_cli(*train_args(run_dir, FULL), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = [line for line in proc.stdout.splitlines() if "not saved" in line]
    assert [line.split(":")[0] for line in failed] == [f"checkpoint of step {s} not saved" for s in (20, 30)]
    assert all(re.search(rf"not saved: no space left under {run_dir / 'checkpoints'} \(it needs about [\d.]+ MiB,"
                         r" [\d.]+ MiB are free; rank 0: .+\); the previous checkpoint \S+global_step10 is"
                         r" intact\. The run goes on and tries again at the next checkpoint\.$", line)
               for line in failed), failed
    assert sorted(p.name for p in disk.glob("global_step*")) == ["global_step10"]  # the failed ones removed again
    resumed = tmp_path / "resumed"
    shutil.copytree(disk, resumed / "checkpoints")
    (resumed / "checkpoints" / "latest").write_text("global_step10")
    proc = run_cli(*train_args(resumed, FULL), timeout=600)
    assert proc.returncode == 0 and "resuming from step 10" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = [read_scalars(d, lambda t: t == "train/loss")["train/loss"] for d in (straight, resumed)]
    assert {s: v for s, v in losses[0].items() if s >= 10} == {s: v for s, v in losses[1].items() if s >= 10}


def test_a_save_that_fails_on_one_rank_only_fails_everywhere_and_the_run_goes_on(tmp_path):
    """dp 2: rank 1's ZeRO shard of step 30 cannot be written (a directory put where its file goes once the step-10
    checkpoint exists: a real IsADirectoryError inside DeepSpeed's save, after its first barrier, on that rank
    alone). Every rank agrees that the save failed, within the collectives' timeout: the earlier checkpoints stay,
    the run completes and saves step 40."""
    run_dir = tmp_path / "run"
    log = open(tmp_path / "log", "w")
    job = subprocess.Popen(cli_command(*train_args(run_dir, FULL + (
        "train.steps=40", "train.eval_interval=40", "train.micro_batch_size=2", "parallel.timeout=60",
        "checkpoint.keep_last=0")), launcher=torchrun(2)), stdout=log, stderr=subprocess.STDOUT, env=child_env())
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "global_step10" / "manifest.json").exists():
            assert job.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()[-3000:]
            time.sleep(0.01)
        (run_dir / "checkpoints" / "global_step30" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").mkdir(parents=True)
        assert job.wait(timeout=300) == 0, (tmp_path / "log").read_text()[-3000:]
    finally:
        job.kill()
    out = (tmp_path / "log").read_text()
    failed = [line for line in out.splitlines() if "not saved" in line]
    assert len(failed) == 1 and failed[0].startswith("checkpoint of step 30 not saved: a write failed under"), failed
    assert "rank 1: " in failed[0] and "global_step20 is intact" in failed[0]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("global_step*")) == [
        "global_step10", "global_step20", "global_step40"]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


def test_deepspeeds_save_passes_the_barriers_prores_meets_after_a_failure(tmp_path, world_of_one):
    """prores.run.checkpoint.SAVE_BARRIERS is deepspeed's count in engine.save_checkpoint: a rank whose save failed
    meets that many barriers, so a DeepSpeed that changes it must fail here."""
    from prores.config import load_config
    from prores.launcher.builders import build_engine, build_model
    from prores.run.checkpoint import SAVE_BARRIERS, _counted_barriers

    cfg = load_config(None, ("model.num_layers=1", "model.hidden_size=16", "model.ffn_hidden_size=32",
                             "model.seq_length=8", "kernels.backend=eager"))
    engine = build_engine(cfg, build_model(cfg, world_of_one, 258, torch.device("cpu")).module, world_of_one)
    with _counted_barriers() as passed:
        engine.save_checkpoint(str(tmp_path), tag="t", save_latest=False)
    assert passed[0] == SAVE_BARRIERS


def test_slurm_train_sbatch_restarts_a_step_whose_rank_was_killed(straight, tmp_path):
    """slurm/train.sbatch on the real (local) Slurm, 2 tasks (pp=2): rank 1 SIGKILLed after the step-100
    checkpoint ends the job step (srun --kill-on-bad-exit); the script starts it again in the same allocation and
    the run ends as the straight one."""
    need(slurm_available(), NO_SLURM)
    env = child_env(PRORES_PYTHON=sys.executable, PRORES_RUN_DIR=str(tmp_path / "run"))
    sub = subprocess.run(["sbatch", "--parsable", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1",
                          "--overcommit", "--time=20", f"--chdir={ROOT}", f"--output={tmp_path}/job.out",
                          str(ROOT / "slurm" / "train.sbatch"), *train_args("IGNORED", CONFIG)[3:]],
                         capture_output=True, text=True, env=env)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    run_dir = tmp_path / "run"
    try:
        deadline = time.monotonic() + 600
        while not (run_dir / "checkpoints" / f"global_step{FAULT_AFTER}" / "manifest.json").exists():
            assert time.monotonic() < deadline, (tmp_path / "job.out").read_text()[-3000:]
            time.sleep(0.05)
        [rank1] = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])
                   and "prores" in p.info["cmdline"] and p.environ().get("SLURM_PROCID") == "1"]
        rank1.kill()
        while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
            assert time.monotonic() < deadline + 600, (tmp_path / "job.out").read_text()[-3000:]
            time.sleep(0.5)
    finally:
        subprocess.run(["scancel", job])
    out = (tmp_path / "job.out").read_text()
    assert "restarting it in the job (1 of PRORES_MAX_RESTARTS=3)" in out, out[-3000:]
    summary = assert_a_straight_runs_losses(run_dir, straight)
    assert summary["restarts"] == 1 and [f["kind"] for f in summary["faults"]] in (["rank lost"], ["hang"])
