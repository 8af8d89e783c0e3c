"""Preemption-safe runs: exact resume after SIGKILL, damaged checkpoints, agreed stops, Slurm requeue.

Run A trains 20 steps straight. Run B is the same command, SIGKILLed right
after its step-10 checkpoint and started again: steps 11-20 (TensorBoard
steps 10-19) must repeat A bit for bit - loss, alpha, data position - and the
final weights must be identical.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator

import conftest
from conftest import NO_SLURM, child_env, cli_command, need, run_cli, slurm_available, torchrun
from prores.config import load_config
from prores.run.signals import STOP_SIGNALS, StopSignals
from prores.model.gpt import gpt_pieces
from prores.model.prores import ProRes
from prores.parallel.consolidate import consolidated_weights

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
STEPS, KILL_AFTER = 20, 10
# ~0.2 s a step on 2 cores: 10 steps of margin to kill B between its step-10 and step-20 checkpoints
CONFIG = ("model.num_layers=8", "model.seq_length=128", "train.micro_batch_size=8", f"train.steps={STEPS}",
          "train.log_interval=1", "train.eval_interval=10", "data.eval_samples=16", "checkpoint.interval=10",
          "kernels.backend=eager", "logging.progress_bar=false")
# dropout: each data-parallel rank draws its own masks, and a resume draws the same ones again
# a fractional T: T·L = 14 lies between the kill at step 10 and the end, so the resumed run saturates
LAYOUTS = {"pp1": (None, ()), "pp2": (torchrun(2), ("parallel.pp=2",)),
           "dp2-dropout": (torchrun(2), ("train.micro_batch_size=4", "model.dropout=0.1")),
           "pp1-T1.75": (None, ("prores.T=1.75",)),
           "pp1-layerscale": (None, ("model.norm_layout=layerscale", "model.layerscale_init=0.1"))}


def train_args(run_dir, *overrides) -> list[str]:
    return conftest.train_args(run_dir, CONFIG + overrides)


def scalars(run_dir) -> dict:
    """All event files of a run as TensorBoard shows them (a resume's purge_step applied)."""
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def manifest(run_dir, step) -> Path:
    return Path(run_dir) / "checkpoints" / f"global_step{step}" / "manifest.json"


def start(args, launcher=None, log=None) -> subprocess.Popen:
    return subprocess.Popen(cli_command(*args, launcher=launcher), stdout=log or subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)


def wait_for(condition, proc, timeout=600, what=""):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def kill_after_checkpoint(run_dir, launcher, extra=()):
    proc = start(train_args(run_dir, *extra), launcher)
    wait_for(lambda: manifest(run_dir, KILL_AFTER).exists(), proc, what="the step-10 checkpoint")
    launcher = psutil.Process(proc.pid)
    tree = [launcher] + launcher.children(recursive=True)
    for p in tree:  # the launcher and every worker, whatever session they are in
        p.kill()
    proc.wait()
    psutil.wait_procs(tree, timeout=30)
    assert not manifest(run_dir, STEPS).exists(), "B finished before it could be killed; slow the steps down"



def full_weights(run_dir, overrides):
    cfg = load_config(None, CONFIG + overrides)
    m = cfg.model
    pieces = [p.cls(**p.kwargs) for p in gpt_pieces(m, ProRes(cfg.prores.schedule, cfg.prores.T, m.num_layers),
                                                     258, cfg.train.seed)]
    return consolidated_weights(Path(run_dir) / "checkpoints" / f"global_step{STEPS}", pieces)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Run A per layout: 20 uninterrupted steps."""
    runs = {}
    for name, (launcher, extra) in LAYOUTS.items():
        run_dir = tmp_path_factory.mktemp(f"A-{name}")
        proc = run_cli(*train_args(run_dir, *extra), launcher=launcher)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = run_dir
    return runs


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_resume_after_sigkill_repeats_the_run_bit_for_bit(straight, name, tmp_path, world_of_one):
    launcher, extra = LAYOUTS[name]
    run_b = tmp_path / "B"
    kill_after_checkpoint(run_b, launcher, extra)
    proc = run_cli(*train_args(run_b, *extra), launcher=launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from step {KILL_AFTER}: {run_b}/checkpoints/global_step{KILL_AFTER}" in proc.stdout
    a, b = scalars(straight[name]), scalars(run_b)
    assert set(a) == set(b)
    for tag in set(a) - {"train/tokens_per_sec"}:  # everything but the clock
        assert sorted(a[tag]) == sorted(b[tag]), tag  # every step once, none lost or doubled
        after = {s: v for s, v in a[tag].items() if s >= KILL_AFTER}
        assert after == {s: b[tag][s] for s in after}, tag  # loss, alpha, samples, lr, valid: bitwise
    assert b["train/samples"][STEPS - 1] == STEPS * 8
    wa, wb = full_weights(straight[name], extra), full_weights(run_b, extra)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("name", ["pp1", "pp2"])
def test_a_divergence_keeps_the_last_good_checkpoint_and_the_run_resumes_from_it(straight, name, tmp_path):
    """Resumed from step 10 with a learning rate that overflows the weights, B diverges: exit status 3
    (torchrun's agent is ended instead), status "diverged" in the summary, nothing saved after step 10
    and that checkpoint untouched. Resumed again as configured, B is the straight run, bit for bit."""
    launcher, extra = LAYOUTS[name]
    run_b = tmp_path / "B"
    kill_after_checkpoint(run_b, launcher, extra)
    good = run_b / "checkpoints" / f"global_step{KILL_AFTER}"
    before = {p: p.read_bytes() for p in good.rglob("*") if p.is_file()}
    proc = run_cli(*train_args(run_b, *extra, "optim.lr=1e30"), launcher=launcher)
    assert proc.returncode == (-signal.SIGKILL if launcher else 3), proc.stderr[-3000:]
    summary = json.loads((run_b / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged_at"] > KILL_AFTER
    assert (f"diverged at step {summary['diverged_at']}: loss" in proc.stdout
            and f"the last good checkpoint {good} is kept" in proc.stdout)
    assert sorted(p.name for p in (run_b / "checkpoints").glob("global_step*")) == [good.name]
    assert {p: p.read_bytes() for p in good.rglob("*") if p.is_file()} == before
    proc = run_cli(*train_args(run_b, *extra), launcher=launcher)
    assert proc.returncode == 0 and f"resuming from step {KILL_AFTER}" in proc.stdout, proc.stderr[-3000:]
    assert json.loads((run_b / "summary.json").read_text())["status"] == "completed"
    a, b = scalars(straight[name]), scalars(run_b)
    for tag in set(a) - {"train/tokens_per_sec"}:
        after = {s: v for s, v in a[tag].items() if s >= KILL_AFTER}
        assert {s: v for s, v in b[tag].items() if s >= KILL_AFTER} == after, tag


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(straight, tmp_path):
    run = tmp_path / "A"
    shutil.copytree(straight["pp1"], run)
    (run / "summary.json").unlink()  # killed after its last checkpoint: not finished
    victim = run / "checkpoints" / f"global_step{STEPS}" / "layer_03-model_00-model_states.pt"
    size = victim.stat().st_size
    half = size // 2
    with open(victim, "r+b") as fh:
        fh.truncate(half)
    proc = run_cli(*train_args(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (f"warning: checkpoint {run}/checkpoints/global_step{STEPS} is damaged (layer_03-model_00-model_states.pt"
            f" has {half} bytes, {size} were written") in proc.stdout
    assert f"resuming from step {KILL_AFTER}:" in proc.stdout
    assert (run / "checkpoints" / f"global_step{STEPS}.damaged" / victim.name).exists()  # set aside, not deleted
    got, want = (json.loads((r / "summary.json").read_text()) for r in (run, straight["pp1"]))
    assert (got["steps"], got["final_valid_loss"]) == (want["steps"], want["final_valid_loss"])


def test_resume_refuses_another_pp_without_zero_and_no_resume_needs_overwrite(straight, tmp_path):
    run = tmp_path / "A"
    shutil.copytree(straight["pp1"], run)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    proc = run_cli(*train_args(run, "parallel.pp=2", "parallel.zero_stage=0"), launcher=torchrun(2), timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.count("cannot be resumed exactly here (parallel.zero_stage 1 -> 0; parallel.pp 1 -> 2):"
                             " another layout reads the ZeRO-1 optimizer shards by name") == 1
    proc = run_cli(*train_args(run), "--no-resume", timeout=300)
    assert proc.returncode == 2 and "already has checkpoints" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing touched
    proc = run_cli(*train_args(run), "--no-resume", "--overwrite")
    assert proc.returncode == 0 and "resuming" not in proc.stdout
    assert scalars(run).keys() == scalars(straight["pp1"]).keys()
    assert scalars(run)["train/loss"] == scalars(straight["pp1"])["train/loss"]  # a fresh, identical run
    assert len(list(run.glob("events.out.tfevents.*"))) == 1  # the old events went with the old checkpoints


def test_a_stop_signal_to_one_rank_stops_all_at_the_same_step(straight, tmp_path):
    """SIGUSR1 to the second stage only; then SIGTERMs to both ranks until the checkpoint is written:
    the ranks agree on one step, the save is not disturbed, and the resumed run is the straight one."""
    run = tmp_path / "S"
    log = open(tmp_path / "log", "w")
    proc = start(train_args(run, "parallel.pp=2"), torchrun(2), log)
    wait_for(lambda: manifest(run, KILL_AFTER).exists(), proc, what="the step-10 checkpoint")
    workers = {p.environ().get("RANK"): p for p in psutil.Process(proc.pid).children(recursive=True)
               if p.environ().get("RANK") in ("0", "1")}
    assert sorted(workers) == ["0", "1"]
    workers["1"].send_signal(signal.SIGUSR1)
    # the stop's checkpoint: a new one, or the step-10 one when the stop is agreed right after that save
    saved = lambda: re.search(r"checkpoint \S+ saved", (tmp_path / "log").read_text())  # noqa: E731
    while proc.poll() is None and not saved():
        for worker in workers.values():
            try:
                worker.send_signal(signal.SIGTERM)  # a second (third, ...) signal during the save
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.05)
    assert proc.wait(timeout=300) == 0
    out = (tmp_path / "log").read_text()
    stopped = [int(l.rsplit(" ", 1)[1]) for l in out.splitlines() if "stopping after step" in l]
    assert len(stopped) == 1 and KILL_AFTER <= stopped[0] < STEPS
    assert re.search(r"stop signal \((SIGUSR1|SIGTERM|on another rank)\): stopping after step", out)
    assert "not a Slurm job: run the same command again to resume" in out
    assert manifest(run, stopped[0]).exists()
    assert json.loads((run / "summary.json").read_text())["status"] == "stopped"
    proc = run_cli(*train_args(run, "parallel.pp=2"), launcher=torchrun(2))
    assert proc.returncode == 0 and f"resuming from step {stopped[0]}" in proc.stdout
    b, a = scalars(run), scalars(straight["pp2"])
    assert b["train/loss"] == a["train/loss"]


def test_retention_keeps_the_newest_and_every_kth(tmp_path):
    small = ("model.num_layers=2", "model.seq_length=32", "train.micro_batch_size=4", "train.steps=10",
             "checkpoint.interval=2", "checkpoint.keep_last=2", "checkpoint.keep_every=4")
    proc = run_cli(*train_args(tmp_path, *small))
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert kept == ["global_step10", "global_step4", "global_step8"]  # newest 2 = 8, 10; every 4th = 4, 8
    assert (tmp_path / "checkpoints" / "latest").read_text() == "global_step10"


def test_retention_keeps_the_steps_named(tmp_path):
    small = ("model.num_layers=2", "model.seq_length=32", "train.micro_batch_size=4", "train.steps=10",
             "checkpoint.interval=2", "checkpoint.keep_last=1", "checkpoint.keep_steps=[2, 6]")
    proc = run_cli(*train_args(tmp_path, *small))
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert kept == ["global_step10", "global_step2", "global_step6"]


def preempted_sbatch_job(tmp_path, resources: list[str], args: list[str], checkpoint_step: int,
                         while_requeued: tuple[str, ...] = ()) -> tuple[str, str]:
    """slurm/train.sbatch with ``resources`` and the prores ``args``, run directory ``tmp_path/run``: SIGUSR1 to
    its batch shell after the ``checkpoint_step`` checkpoint; once requeued, ``scontrol update`` of
    ``while_requeued`` (e.g. other nodes); then it runs to the end, which must be COMPLETED. (job.out, job id)."""
    env = child_env(PRORES_PYTHON=sys.executable, PRORES_RUN_DIR=str(tmp_path / "run"))
    sub = subprocess.run(["sbatch", "--parsable", *resources, "--gpus-per-node=0", "--cpus-per-task=1",
                          "--overcommit", "--time=20", f"--chdir={ROOT}", f"--output={tmp_path}/job.out",
                          str(ROOT / "slurm" / "train.sbatch"), *args], capture_output=True, text=True, env=env)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]

    def state():
        info = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        return dict(kv.split("=", 1) for kv in info.split() if "=" in kv)

    try:
        deadline = time.monotonic() + 600
        while not manifest(tmp_path / "run", checkpoint_step).exists():
            assert time.monotonic() < deadline and state()["JobState"] in ("PENDING", "RUNNING"), state()
            time.sleep(0.05)
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)
        while state()["JobState"] != "PENDING" or state().get("Restarts") != "1":
            assert time.monotonic() < deadline, state()
            time.sleep(0.2)
        if while_requeued:
            subprocess.run(["scontrol", "update", f"JobId={job}", *while_requeued], check=True)
        # Slurm holds a requeued job back (~2 min) so that it never starts in the second its old
        # credential was revoked (slurmd compares whole seconds: "Job credential revoked", FAILED).
        # Skip most of that wait, not all of it.
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now+2"], check=True)
        while state()["JobState"] in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING"):
            assert time.monotonic() < deadline, state()
            time.sleep(0.5)
    finally:
        subprocess.run(["scancel", job])
    out = (tmp_path / "job.out").read_text()
    assert state()["JobState"] == "COMPLETED", out[-3000:]
    return out, job


def test_sbatch_preemption_checkpoints_requeues_and_finishes(request, tmp_path):
    """slurm/train.sbatch with 2 tasks (tp=2); SIGUSR1 to the batch shell -> save, requeue, resume, finish."""
    need(slurm_available(), NO_SLURM)
    straight = request.getfixturevalue("straight")  # only once Slurm is known to answer
    args = train_args("IGNORED", "parallel.tp=2", "checkpoint.interval=5")[3:]  # the --set pairs
    out, job = preempted_sbatch_job(tmp_path, ["--ntasks-per-node=2"], args, checkpoint_step=5)
    assert "stop signal (SIGUSR1): stopping after step" in out and f"requeued Slurm job {job}" in out
    assert "resuming from step" in out and "(restart 1)" in out
    final = json.loads((tmp_path / "run" / "summary.json").read_text())["final_valid_loss"]
    want = json.loads((straight["pp1"] / "summary.json").read_text())["final_valid_loss"]
    assert final == pytest.approx(want, rel=1e-5)  # tp=2 vs one process: reduction order only


def test_stop_signals_stay_caught_once_a_stop_arrived():
    """No stop: the previous handlers come back. A stop: a repeat SIGTERM during the exit that follows
    (Slurm's requeue sends one) is caught too, not a kill."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    with StopSignals() as quiet:
        pass
    assert quiet.received is None and {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == previous
    try:
        with StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # would end pytest if the default handler were back
        assert stop.received == "SIGUSR1"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
