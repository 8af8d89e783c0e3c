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
from prores.errors import UsageError
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


# ---------------------------------------------------------------------- the races of issue 26, one by one


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_heartbeat_survives_a_lock_file_missing_for_a_moment(tmp_path):
    """NFS: the file is briefly missing; the heartbeat used to stop for good at the first failed utime."""
    lock = RunLock(tmp_path, lease=4.0, heartbeat=0.1)
    lock.acquire()
    try:
        path, aside = tmp_path / LOCK, tmp_path / "away"
        os.rename(path, aside)
        time.sleep(0.5)  # several beats fail
        os.rename(aside, path)
        before = path.stat().st_mtime_ns
        wait_until(lambda: path.stat().st_mtime_ns != before)  # beating again
        assert lock.lost() is None
    finally:
        lock.release()
    assert not (tmp_path / LOCK).exists()


def test_a_holder_that_cannot_renew_stops_while_its_lease_holds_and_leaves_the_file(tmp_path):
    lock = RunLock(tmp_path, lease=1.0, heartbeat=0.1)
    lock.acquire()
    path, aside = tmp_path / LOCK, tmp_path / "away"
    os.rename(path, aside)
    assert lock.lost() is None
    wait_until(lambda: lock.lost() is not None)
    assert time.monotonic() - lock.renewed < lock.lease  # said at half the lease: time to checkpoint
    assert "could not be renewed" in lock.lost()
    time.sleep(lock.lease)  # lapsed: the heartbeat has stopped
    os.rename(aside, path)
    mtime = path.stat().st_mtime_ns
    time.sleep(0.3)
    assert path.stat().st_mtime_ns == mtime  # a lapsed holder never renews what may be another's lock
    lock.release()
    assert path.exists()  # nor removes it


def test_a_holder_whose_lock_names_another_has_lost_it(tmp_path):
    lock = RunLock(tmp_path, lease=4.0, heartbeat=0.1)
    lock.acquire()
    write_lock(tmp_path, pid=1, start="1")  # a takeover replaced it
    wait_until(lambda: lock.taken is not None)
    assert lock.lost().startswith(f"the run directory's lock {tmp_path / LOCK} was taken over by pid 1")
    lock.release()
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == 1


def dead_holder_lock(run_dir):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_lock(run_dir, pid=int(gone.stdout), start="1")


def test_two_takers_of_one_stale_lock_take_it_once(tmp_path):
    """Both judged the dead holder's lock stale; the first took it over. The second acts on what it judged,
    which is no longer there: it leaves the first's lock alone and is refused."""
    from prores.run.lock import identity

    dead_holder_lock(tmp_path)
    judged = identity(tmp_path / LOCK)
    first = RunLock(tmp_path, say=lambda m: None)
    first.acquire()
    try:
        second = RunLock(tmp_path)
        second._take_over(judged, "a trainer that is gone")
        assert read_pid(tmp_path) == os.getpid() and first.lost() is None
        with pytest.raises(RunDirectoryInUse):
            second.acquire()
    finally:
        first.release()


def read_pid(run_dir):
    return json.loads((run_dir / LOCK).read_text())["pid"]


def test_a_takeover_never_removes_a_lock_it_did_not_judge_stale(tmp_path, monkeypatch):
    """The interleaving the old code lost a live lock in: between the taker's check and its rename the stale
    lock is replaced by a live one (Y), and between its rename and its put-back a third creates one (Z). The
    taker must remove neither: Y stays on disk beside Z, and Y's holder learns at its next beat that it lost."""
    from prores.run import lock as lock_module

    dead_holder_lock(tmp_path)
    judged = lock_module.identity(tmp_path / LOCK)
    y = RunLock(tmp_path, lease=4.0, heartbeat=0.1)
    real_rename, real_link = os.rename, os.link

    def rename_after_a_swap(src, dst):
        if str(src) == str(tmp_path / LOCK) and "stale" in str(dst):
            os.unlink(src)  # the stale lock goes (its holder released) and a live one takes its place
            y._create()
            y.renewed = time.monotonic()
            monkeypatch.setattr(os, "rename", real_rename)
        return real_rename(src, dst)

    def link_after_a_third(src, dst):
        write_lock(tmp_path, pid=1, start="1")  # Z
        return real_link(src, dst)

    monkeypatch.setattr(os, "rename", rename_after_a_swap)  # the pre-check under the mutex saw the judged file
    monkeypatch.setattr(os, "link", link_after_a_third)
    RunLock(tmp_path)._take_over(judged, "a trainer that is gone")
    monkeypatch.undo()
    survivors = {json.loads(p.read_text())["pid"] for p in tmp_path.glob(f"{LOCK}*") if p.name != f"{LOCK}.takeover"}
    assert survivors == {os.getpid(), 1}  # Y (moved aside, not removed) and Z
    assert not (tmp_path / f"{LOCK}.takeover").exists()


def test_a_failed_probe_is_never_evidence_of_staleness(small_tmpfs):
    """A full file system (no inode left for the probe that reads the server's clock): a holder on another
    host with a fresh heartbeat is alive to the status tools and is not taken over."""
    run_dir = small_tmpfs(size="64k", inodes=3)  # the root, the lock, and one to spare
    write_lock(run_dir, host="elsewhere/boot/pid:[1]", pid=1, start="1")
    (run_dir / "filler").write_text("")
    assert live_holder(run_dir) is not None
    with pytest.raises(UsageError, match=r"cannot tell whether the holder of .*lock is alive: cannot write"
                                         r" .*lock-clock-\d+ to read the file server's clock: No space left on"
                                         r" device\. Free space \(or quota\)"):
        RunLock(run_dir, lease=1.0).acquire()
    assert read_pid(run_dir) == 1


def test_stress_exactly_one_holder_at_every_instant(tmp_path):
    """8 processes (tests/lock_stress_worker.py), hundreds of acquisitions, takeovers of dead and hung holders,
    a lease of 2 s. The log is
    append-only and its lines come in one order: every acquisition's lines must be one unbroken run."""
    log = tmp_path / "log"
    log.write_text("")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    seeds = iter(range(10_000))

    def spawn():
        return subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "lock_stress_worker.py"),
                                 str(run_dir), str(log), str(next(seeds))], env=child_env())

    procs = [spawn() for _ in range(8)]
    deadline = time.monotonic() + 150
    try:
        while time.monotonic() < deadline:
            tags = [line for line in log.read_text().splitlines() if not line.startswith("#")]
            if len(set(tags)) >= 300:
                break
            for i, p in enumerate(procs):
                if p.poll() is not None:  # reaped at once, so its pid is gone to the others' check
                    assert p.returncode == 0
                    procs[i] = spawn()
            time.sleep(0.01)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    lines = log.read_text().splitlines()
    tags = [line for line in lines if not line.startswith("#")]
    runs = [t for i, t in enumerate(tags) if i == 0 or t != tags[i - 1]]
    assert len(runs) == len(set(runs)), "two holders at once: an acquisition's lines were interleaved with another's"
    takeovers = [line for line in lines if line.startswith("# taking over")]
    assert len(set(runs)) >= 200
    assert any("gone (pid" in t and "host stress-" in t for t in takeovers)  # by the lease
    assert any("gone (pid" in t and "host stress-" not in t for t in takeovers)  # by the pid


def test_a_lapsed_holder_writes_nothing_after_the_takeover(tmp_path):
    """A trainer (tests/lapsed_holder.py: a 2 s lease, posing as another host) stops itself (SIGSTOP) in its first
    checkpoint, between the manifest and ``latest``, and stays stopped past its lease; a taker takes the lock over
    meanwhile. Continued, the lapsed trainer exits 75 with one line, and not a byte of the run directory changed
    after the takeover (no ``latest``, no pruning, no summary, no events, no progress)."""
    import signal

    run = tmp_path / "run"
    args = train_args(run, TRAIN + ("checkpoint.interval=20", "train.hang_timeout=0"))
    log = open(tmp_path / "holder.log", "w")
    holder = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "lapsed_holder.py"), *args],
                              stdout=log, stderr=subprocess.STDOUT, env=child_env())
    taker = RunLock(run, lease=2.0, heartbeat=0.2)
    try:
        deadline = time.monotonic() + 300
        while not os.WIFSTOPPED(os.waitpid(holder.pid, os.WNOHANG | os.WUNTRACED)[1]):
            assert holder.poll() is None and time.monotonic() < deadline, (tmp_path / "holder.log").read_text()
            time.sleep(0.05)
        assert (run / "checkpoints" / "global_step20" / "manifest.json").exists()
        assert not (run / "checkpoints" / "latest").exists()
        taker.acquire()  # waits out the stopped holder's lease, then takes the lock over
        before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file() and p.name != LOCK}
        holder.send_signal(signal.SIGCONT)
        assert holder.wait(timeout=120) == 75
        after = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file() and p.name != LOCK}
        assert after == before
        out = (tmp_path / "holder.log").read_text()
        assert out.count(f"exiting 75 without writing anything more into {run}") == 1, out[-3000:]
        assert "Traceback" not in out
        assert not (run / "summary.json").exists()
    finally:
        holder.kill()
        taker.release()


def test_a_lapsed_holder_publishes_and_prunes_nothing(tmp_path):
    """The two writes :meth:`Checkpoints.save` makes as the lock's holder ask ``held`` just before they act: a
    publish by rename leaves neither the file nor its temporary, and retention removes no directory."""
    from prores.run.checkpoint import Checkpoints
    from prores.run.files import write_atomic

    assert not write_atomic(tmp_path / "latest", "global_step4", held=lambda: False)
    assert list(tmp_path.iterdir()) == []
    assert write_atomic(tmp_path / "latest", "global_step4", held=lambda: True)
    assert (tmp_path / "latest").read_text() == "global_step4"
    for step in (2, 4, 6):
        (tmp_path / "checkpoints" / f"global_step{step}").mkdir(parents=True)
    Checkpoints(tmp_path, keep_last=1, held=lambda: False)._prune(keep=6)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["global_step2", "global_step4",
                                                                            "global_step6"]
    Checkpoints(tmp_path, keep_last=1)._prune(keep=6)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["global_step6"]


def test_a_lapsed_holder_hands_no_event_to_the_writer(tmp_path):
    """RunWriter asks ``held`` before each scalar event, image and layout, whichever thread writes them (the
    heatmaps' painter draws on its own, and may wake from a freeze mid-picture): once it is false, the event
    file grows no more."""
    import numpy as np

    from prores.monitor.tensorboard import RunWriter

    held = [True]
    writer = RunWriter(tmp_path, 0, owns_loss=True, owns_layers=True, held=lambda: held[0])
    writer.loss_scalars({"train/loss": 2.5}, 1)
    writer.flush()
    events = list(tmp_path.iterdir())
    size = events[0].stat().st_size
    held[0] = False
    writer.loss_scalars({"train/loss": 2.0}, 2)
    writer.layer_scalars("act_rms", {0: 1.0}, 2)
    writer.image("heatmap", np.zeros((4, 4, 3), dtype=np.uint8), 2)
    writer.layout(has_gains=False)
    writer.close()
    assert list(tmp_path.iterdir()) == events and events[0].stat().st_size == size
    assert read_scalars(tmp_path) == {"train/loss": {1: 2.5}}


@pytest.mark.parametrize("held", [True, False])
def test_a_watchdog_that_wakes_past_its_bound_after_its_lock_lapsed_writes_nothing(tmp_path, held):
    """A rank stopped past its bound and its lock's lease wakes to find its step hung: while it holds the lock it
    writes its stacks and its fault record and exits 124, and once the lock lapsed it writes nothing, says so
    and exits 75."""
    script = (f"import time; from prores.run.watchdog import Watchdog\n"
              f"Watchdog({{'first step': 0.2}}, {str(tmp_path)!r}, 0, held=lambda: {held}).start(5)\n"
              "time.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=child_env())
    if held:
        assert proc.returncode == 124 and (tmp_path / "hangs" / "step5-rank0.txt").exists(), proc.stderr
        [fault] = (tmp_path / "faults").iterdir()
        assert json.loads(fault.read_text())["kind"] == "hang"
    else:
        assert proc.returncode == 75 and list(tmp_path.iterdir()) == [], proc.stderr
        assert proc.stderr.count(f"exiting 75 without writing anything more into {tmp_path}") == 1, proc.stderr
