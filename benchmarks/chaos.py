"""Chaos: a torchrun job with restarts allowed, hit by faults at random steps, must end as an unfaulted run.

    python benchmarks/chaos.py --faults 10 --seed 1            # 4 ranks, tp2 x pp2, 400 steps
    python benchmarks/chaos.py --faults 3 --ranks 2 --tp 1 --pp 2 --kinds kill,stop,term --steps 200

The faults, at random steps, in a random order that takes every kind once before any twice (one at a time,
each once the job is back at work after the one before):

* ``kill``: SIGKILL of a random rank (a dead node);
* ``stop``: SIGSTOP of a random rank (a hang: ``train.hang_timeout`` finds it);
* ``term``: SIGTERM to every rank (a preemption: a checkpoint, exit 0), and the job started again, as a
  requeue does;
* ``corrupt``: the newest checkpoint's largest file truncated, then a rank killed: the restart must set the
  checkpoint aside and resume from the one before;
* ``enospc``: the checkpoint file system (a tmpfs of its own; needs root) filled up before a save: the save
  fails, says so, and the run goes on.

At the end every logged ``train/loss`` and the final validation loss must equal the unfaulted run's, bit for
bit. It prints the faults injected, detected and recovered, the time each cost, and the goodput: the unfaulted
run's training time over the chaos run's wall time. Exit 1 when the two runs differ.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from prores.monitor.tensorboard import read_scalars
from prores.parallel.rendezvous import own_world

KINDS = ("kill", "stop", "term", "corrupt", "enospc")


def config(args) -> list[str]:
    sets = [f"parallel.tp={args.tp}", f"parallel.pp={args.pp}", "model.num_layers=4", "model.hidden_size=32",
            "model.ffn_hidden_size=64", "model.num_heads=4", "model.seq_length=32", "train.micro_batch_size=4",
            "data.eval_samples=8", "kernels.backend=eager", f"train.steps={args.steps}", "train.log_interval=1",
            f"train.eval_interval={args.steps}", f"checkpoint.interval={args.interval}", "checkpoint.keep_last=3",
            "logging.progress_bar=false", "train.hang_timeout=20", "train.hang_timeout_first_step=300",
            "train.hang_timeout_eval=20", "checkpoint.save_timeout=20",
            f"train.max_restarts_without_progress={args.faults + 1}"]
    return [a for s in sets for a in ("--set", s)]


def start(args, run_dir: Path, log) -> subprocess.Popen:
    command = ["torchrun", "--standalone", f"--nproc_per_node={args.ranks}", f"--max-restarts={args.faults + 1}",
               "-m", "prores", "train", "--run-dir", str(run_dir), *config(args)]
    env = own_world(os.environ) | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def workers(job: subprocess.Popen) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(job.pid).children(recursive=True):
        try:
            if "RANK" in p.environ() and "prores" in p.cmdline():
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def progress(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "progress.json").read_text())["step"]
    except (OSError, ValueError):
        return -1


def status(run_dir: Path):
    try:
        return json.loads((run_dir / "summary.json").read_text())["status"]
    except (OSError, ValueError):
        return None


def starts(run_dir: Path) -> list[dict]:
    try:
        lines = (run_dir / "attempts.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [a for a in map(json.loads, lines) if a["event"] == "start"]


def running_since(run_dir: Path, after: int) -> bool:
    """A start newer than the first ``after`` has stepped: the job is back at work."""
    now = starts(run_dir)
    if len(now) <= after:
        return False
    try:
        seen = json.loads((run_dir / "progress.json").read_text())
    except (OSError, ValueError):
        return False
    return seen["time"] > now[-1]["time"] and seen["step"] > now[-1]["step"]


def newest_checkpoint(run_dir: Path):
    done = sorted((int(p.parent.name[len("global_step"):]), p.parent)
                  for p in (run_dir / "checkpoints").glob("global_step*/manifest.json")
                  if p.parent.name[len("global_step"):].isdigit())  # not one set aside as .damaged
    return done[-1] if done else (None, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--interval", type=int, default=20, help="checkpoint.interval")
    parser.add_argument("--kinds", default=",".join(KINDS), help="the faults to draw from")
    parser.add_argument("--out", help="keep the two run directories here (default: a temporary directory)")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if "enospc" in kinds and os.geteuid() != 0:
        parser.error("--kinds enospc mounts a tmpfs: run as root, or leave it out")
    rng = random.Random(args.seed)
    out = Path(args.out or tempfile.mkdtemp(prefix="prores-chaos-"))
    out.mkdir(parents=True, exist_ok=True)

    straight = out / "straight"
    with open(out / "straight.log", "w") as log:
        if start(args, straight, log).wait() != 0:
            print(f"the unfaulted run failed: see {out / 'straight.log'}")
            return 1
    base = json.loads((straight / "summary.json").read_text())

    run_dir, disk = out / "chaos", None
    if "enospc" in kinds:  # the checkpoints on a tmpfs of their own, to fill up for real
        disk = out / "disk"
        disk.mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(disk)], check=True)
        (run_dir).mkdir(exist_ok=True)
        (run_dir / "checkpoints").symlink_to(disk)
    plan = sorted(rng.sample(range(args.interval + 5, args.steps - args.interval), args.faults))
    injected = []
    log = open(out / "chaos.log", "w")
    started = time.monotonic()
    job = start(args, run_dir, log)
    try:
        seen_starts = 0
        order = rng.sample(kinds, len(kinds))  # every kind once before any twice
        for n, at in enumerate(plan):
            kind = order[n % len(order)]
            # back at work after the last fault (a start newer than it has stepped), and at the fault's step
            while not running_since(run_dir, seen_starts) or progress(run_dir) < at:
                if job.poll() is not None:  # a preemption ended the job: start it again, as a requeue would
                    job = start(args, run_dir, log)
                time.sleep(0.05)
            seen_starts = len(starts(run_dir)) if kind != "enospc" else len(starts(run_dir)) - 1
            step, victim = progress(run_dir), rng.choice(workers(job))
            if kind == "kill":
                victim.kill()
            elif kind == "stop":
                victim.suspend()
            elif kind == "term":
                for p in workers(job):
                    p.terminate()
            elif kind == "corrupt":
                _, newest = newest_checkpoint(run_dir)
                biggest = max((p for p in newest.rglob("*.pt")), key=lambda p: p.stat().st_size)
                with open(biggest, "r+b") as fh:
                    fh.truncate(biggest.stat().st_size // 2)
                victim.kill()
            elif kind == "enospc":
                filler, failed = disk / "filler", (out / "chaos.log").read_text().count("not saved")
                subprocess.run(["fallocate", "-l", str(shutil.disk_usage(disk).free), str(filler)], check=False)
                while (out / "chaos.log").read_text().count("not saved") == failed and job.poll() is None:
                    time.sleep(0.05)  # until the next save has failed
                filler.unlink()
            injected.append({"kind": kind, "step": step, "time": time.monotonic() - started})
            print(f"fault {len(injected)}: {kind} at step {step}", flush=True)
        while job.poll() is None or status(run_dir) != "completed":
            if job.poll() is not None:  # the last fault was a preemption
                job = start(args, run_dir, log)
            time.sleep(0.2)
        wall = time.monotonic() - started
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        if disk is not None:
            (run_dir / "checkpoints").unlink(missing_ok=True)
            subprocess.run(["umount", "-l", str(disk)], check=False)

    summary = json.loads((run_dir / "summary.json").read_text())
    text = (out / "chaos.log").read_text()
    kinds_seen = [f["kind"] for f in summary.get("faults", [])]
    # what the run itself saw: its fault records (a stop is a hang; a kill, and a corruption's kill, a rank lost,
    # or a hang when the dead rank's peer waits on it in a call that gloo does not fail), the preemptions it
    # stopped for, the checkpoints it set aside (corrupted on purpose, or left half-written by a fault during a
    # save) and the saves that failed
    detected = {"hang": kinds_seen.count("hang"), "rank lost": kinds_seen.count("rank lost"),
                "preemption": text.count("stop signal (SIGTERM)"), "damaged checkpoint": text.count("is damaged"),
                "failed save": text.count("not saved")}
    losses = [read_scalars(d, lambda t: t == "train/loss")["train/loss"] for d in (straight, run_dir)]
    same = losses[0] == losses[1] and summary["final_valid_loss"] == base["final_valid_loss"]
    counts = {k: sum(i["kind"] == k for i in injected) for k in kinds}
    print(f"\n{len(injected)} faults injected (" + ", ".join(f"{k} {n}" for k, n in counts.items()) + ")")
    print("detected: " + ", ".join(f"{k} {v}" for k, v in detected.items()) + f"; restarts {summary.get('restarts')}")
    for f in summary.get("faults", []):
        print(f"  {f['kind']:>9} at step {f['step']}: {f['steps_lost']} steps and {f['lost_s']:.1f} s lost"
              + (f", detected in {f['detect_s']:.1f} s" if f.get("detect_s") is not None else ""))
    print(f"recovered: {'every fault; the run is bitwise the unfaulted one' if same else 'NO: the runs differ'}"
          f" ({len(losses[1])} losses, final valid loss {summary['final_valid_loss']!r}"
          f" vs {base['final_valid_loss']!r})")
    print(f"goodput {base['train_seconds'] / wall:.3f} (unfaulted training {base['train_seconds']:.0f} s, chaos wall"
          f" {wall:.0f} s); run directories under {out}")
    if not args.out and same:
        shutil.rmtree(out, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
