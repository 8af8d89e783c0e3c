"""One trainer per run directory: the run lock (prores/run/lock.py) and two `prores train` on one directory."""

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import pytest

from conftest import child_env, cli_command, train_args
from prores.monitor.tensorboard import read_scalars
from prores.run.lock import (LEASE_S, LOCK, Holder, RunDirectoryInUse, RunLock, live_holder, process_start,
                             refuse_a_live_holder_here, this_host)


def test_the_lock_names_its_holder_and_goes_with_release(tmp_path):
    lock = RunLock(tmp_path)
    lock.acquire()
    holder = json.loads((tmp_path / LOCK).read_text())
    assert (holder["host"], holder["pid"]) == (this_host(), os.getpid())
    assert holder["start"] == process_start(os.getpid()) and holder["since"].endswith("Z")
    assert live_holder(tmp_path) == Holder(**holder)
    lock.release()
    assert not (tmp_path / LOCK).exists() and live_holder(tmp_path) is None


HOLD = "import sys, time; from prores.run.lock import RunLock; RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)"


def test_a_live_holder_refuses_a_second_one_by_name(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        said = []
        for refuse in (RunLock(tmp_path).acquire, lambda: refuse_a_live_holder_here(tmp_path)):  # the early answer too
            with pytest.raises(RunDirectoryInUse, match=rf"in use by another trainer: pid {holder.pid} on host"
                                                        r" \S+ since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ") as exc:
                refuse()
            said.append(str(exc.value))
        assert said[0] == said[1]
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == holder.pid  # untouched
    finally:
        holder.kill()
        holder.wait()


def write_lock(run_dir, **fields):
    me = Holder.me()
    (run_dir / LOCK).write_text(json.dumps({"host": me.host, "pid": me.pid, "start": me.start,
                                            "since": me.since} | fields))


def test_a_dead_holder_on_this_host_is_taken_over(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_lock(tmp_path, pid=int(gone.stdout), start="1")
    refuse_a_live_holder_here(tmp_path)  # gone: no early refusal
    said = []
    RunLock(tmp_path, said.append).acquire()
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    assert len(said) == 1 and said[0].startswith(f"taking over the lock of a trainer that is gone (pid"
                                                 f" {int(gone.stdout)} on host {this_host().split('/')[0]} since ")


def test_a_reused_pid_is_not_its_holder(tmp_path):
    """The holder's pid now names another process (this one): the start time tells them apart."""
    write_lock(tmp_path, start="0")
    assert live_holder(tmp_path) is None
    said = []
    RunLock(tmp_path, said.append).acquire()
    assert len(said) == 1 and "that is gone" in said[0]


def test_a_holder_on_another_host_lives_while_its_heartbeat_does(tmp_path):
    write_lock(tmp_path, host="elsewhere/boot/pid:[1]", pid=1, start="1")
    stop = threading.Event()

    def beat():
        while not stop.wait(0.3):
            os.utime(tmp_path / LOCK)

    threading.Thread(target=beat, daemon=True).start()
    refuse_a_live_holder_here(tmp_path)  # another host's holder is judged by its heartbeat, in RunLock only
    try:
        started = time.monotonic()
        with pytest.raises(RunDirectoryInUse, match="pid 1 on host elsewhere"):
            RunLock(tmp_path).acquire()
        assert time.monotonic() - started < 5
    finally:
        stop.set()


def test_a_holder_on_another_host_whose_lease_ran_out_is_taken_over(tmp_path):
    write_lock(tmp_path, host="elsewhere/boot/pid:[1]", pid=1, start="1")
    old = time.time() - LEASE_S - 5
    os.utime(tmp_path / LOCK, (old, old))
    assert live_holder(tmp_path) is None
    said = []
    RunLock(tmp_path, said.append).acquire()
    assert len(said) == 1 and "pid 1 on host elsewhere" in said[0]


def test_an_unreadable_lock_past_its_lease_is_taken_over(tmp_path):
    (tmp_path / LOCK).write_text("")  # its writer died between create and write
    old = time.time() - LEASE_S - 5
    os.utime(tmp_path / LOCK, (old, old))
    said = []
    RunLock(tmp_path, said.append).acquire()
    assert said == [f"taking over the lock of an unreadable lock: {tmp_path / LOCK}"]


def _race(run_dir, barrier, results):
    barrier.wait()
    try:
        RunLock(run_dir).acquire()
        results.put("won")
        time.sleep(2)
    except RunDirectoryInUse:
        results.put("refused")


def test_of_many_at_once_exactly_one_wins(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(tmp_path, barrier, results)) for _ in range(6)]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join()
    assert outcomes == ["refused"] * 5 + ["won"]


TRAIN = ("model.num_layers=2", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.seq_length=32",
         "train.micro_batch_size=4", "data.eval_samples=8", "kernels.backend=eager", "train.steps=500",
         "train.log_interval=1", "train.eval_interval=250", "logging.progress_bar=false")  # ~10 s of training


@pytest.mark.slow
def test_a_second_trainer_on_a_run_directory_is_refused_and_changes_nothing(tmp_path):
    log = open(tmp_path / "first.log", "w")  # a pipe nobody reads would stall it once full
    first = subprocess.Popen(cli_command(*train_args(tmp_path / "run", TRAIN)), stdout=log,
                             stderr=subprocess.STDOUT, text=True, env=child_env())
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "run" / LOCK).exists() or not list((tmp_path / "run").glob("events.out.*")):
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        started = time.monotonic()
        second = subprocess.run(cli_command(*train_args(tmp_path / "run", TRAIN)), capture_output=True, text=True,
                                env=child_env(), timeout=60)
        assert time.monotonic() - started < 15
        assert first.poll() is None, "the first trainer ended before the second was refused: train it longer"
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert second.stderr.strip().splitlines() == [
            f"prores: error: run directory {tmp_path / 'run'} is in use by another trainer: pid {first.pid} on host"
            f" {this_host().split('/')[0]} since {json.loads((tmp_path / 'run' / LOCK).read_text())['since']}"
            f" ({tmp_path / 'run' / LOCK}). Wait for it to finish, stop it (kill -TERM {first.pid} on its host),"
            " or give this run another --run-dir."]
        assert first.wait(timeout=600) == 0, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        first.kill()
    assert not (tmp_path / "run" / LOCK).exists()
    alone = subprocess.run(cli_command(*train_args(tmp_path / "alone", TRAIN)), capture_output=True, text=True,
                           env=child_env(), timeout=600)
    assert alone.returncode == 0, alone.stderr[-3000:]
    losses = [read_scalars(tmp_path / d, lambda t: t == "train/loss")["train/loss"] for d in ("run", "alone")]
    assert len(losses[0]) == 500 and losses[0] == losses[1]
