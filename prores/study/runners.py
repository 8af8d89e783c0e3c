"""Running a sweep's cells: each cell is its own `prores train` process (or Slurm array task).

``local``: ``jobs`` cells at a time on this machine, each in its own session
(so a terminal's Ctrl-C reaches the runner, which then stops the cells
cleanly: SIGTERM, a checkpoint at the next step, exit). A re-run skips
completed and diverged cells and resumes the others. ``slurm``: one
``sbatch --array`` per group of cells that need the same resources; each task
runs ``slurm/sweep.sbatch``, which reads its line of ``cells.jsonl`` and runs
``slurm/train.sbatch`` (signal forwarding, checkpoint, requeue).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import prores
from prores.errors import UsageError
from prores.parallel.rendezvous import own_world
from prores.run.progress import Progress
from prores.run.summary import read_summary
from prores.study.state import cell_state, finished, record_exit, record_start
from prores.study.sweep import Cell

SLURM_DIR = Path(prores.__file__).resolve().parents[1] / "slurm"  # slurm/ of the checkout prores runs from


def _cell_env(jobs: int) -> dict:
    """Each cell a world of its own, sharing the cores."""
    env = own_world(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    return env


def run_local(sweep_dir: Path, cells: list[Cell], jobs: int = 1) -> int:
    """0 when no cell failed (a diverged cell is a result, not a failure)."""
    todo = [c for c in cells if not finished(c)]
    if len(todo) < len(cells):
        print(f"prores sweep: {len(cells) - len(todo)} of {len(cells)} cells finished already; skipping them",
              flush=True)
    logs = sweep_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    progress = Progress(len(cells), len(cells) - len(todo), log_interval=1, bar=True, desc="cells", unit="cell")
    done = len(cells) - len(todo)
    running: dict[str, tuple[Cell, subprocess.Popen]] = {}
    states: Counter = Counter()

    def start(cell: Cell) -> None:
        with open(logs / f"{cell.name}.log", "a") as log:
            proc = subprocess.Popen([sys.executable, "-m", "prores", "train", *cell.train_args()], stdout=log,
                                    stderr=subprocess.STDOUT, env=_cell_env(jobs), start_new_session=True)
        record_start(sweep_dir, cell, pid=proc.pid)
        running[cell.name] = (cell, proc)

    def reap() -> None:
        for name, (cell, proc) in list(running.items()):
            if proc.poll() is not None:
                del running[name]
                record_exit(sweep_dir, cell, proc.returncode)
                state = cell_state(sweep_dir, cell).state
                states[state] += 1
                nonlocal done
                done += 1
                loss = (read_summary(Path(cell.run_dir)) or {}).get("final_valid_loss")
                progress.advance(done, f"[{done}/{len(cells)}] {cell.name}: {state}"
                                 + (f", valid loss {loss:.4f}" if loss else ""))

    try:
        while todo or running:
            while todo and len(running) < jobs:
                start(todo.pop(0))
            reap()
            time.sleep(0.2)
    except KeyboardInterrupt:
        print(f"prores sweep: stopping {len(running)} running cell(s) at their next step (a checkpoint each);"
              " Ctrl-C again kills them", flush=True)
        for _, proc in running.values():
            proc.send_signal(signal.SIGTERM)
        try:
            for _, proc in running.values():
                proc.wait()
        except KeyboardInterrupt:
            for _, proc in running.values():
                proc.kill()
        reap()
        progress.close()
        print("prores sweep: stopped; run the same command again to resume", flush=True)
        return 130
    progress.close()
    print("prores sweep: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) if states else
          "prores sweep: nothing to run", flush=True)
    return 1 if states["failed"] else 0


def sbatch_commands(sweep_dir: Path, cells: list[Cell], cells_file: Path) -> list[list[str]]:
    """One `sbatch --array` per group of cells with the same resources."""
    if not (SLURM_DIR / "sweep.sbatch").is_file():
        raise UsageError(f"{SLURM_DIR / 'sweep.sbatch'} not found: the Slurm runner needs the prores checkout's"
                         " slurm/ directory next to the package.")
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(json.dumps(cell.slurm, sort_keys=True), []).append(cell)
    commands = []
    for group in groups.values():
        r = group[0].slurm
        command = ["sbatch", "--parsable", f"--array={','.join(str(c.index) for c in group)}",
                   f"--job-name=prores-{sweep_dir.name}", f"--nodes={r['nodes']}",
                   f"--ntasks-per-node={r['ntasks_per_node']}", f"--gpus-per-node={r['gpus_per_node']}",
                   f"--cpus-per-task={r['cpus_per_task']}", f"--time={r['time']}"]
        if r["partition"]:
            command.append(f"--partition={r['partition']}")
        command += [*r["extra"], f"--output={sweep_dir.resolve() / 'logs'}/%x-%A_%a.out",
                    f"--export=ALL,PRORES_SLURM_DIR={SLURM_DIR},PRORES_PYTHON={sys.executable}",
                    str(SLURM_DIR / "sweep.sbatch"), str(cells_file.resolve())]
        commands.append(command)
    return commands


def run_slurm(sweep_dir: Path, cells: list[Cell], cells_file: Path, dry_run: bool = False) -> int:
    todo = [c for c in cells if not finished(c) and cell_state(sweep_dir, c).state != "running"]
    if not todo:
        print("prores sweep: every cell is finished or running; nothing to submit")
        return 0
    (sweep_dir / "logs").mkdir(parents=True, exist_ok=True)
    for command in sbatch_commands(sweep_dir, todo, cells_file):
        if dry_run:
            print(shlex.join(command))
            continue
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise UsageError(f"`{shlex.join(command)}` failed: {done.stderr.strip()}")
        print(f"prores sweep: submitted job {done.stdout.strip().split(';')[0]} ({command[2]})", flush=True)
    return 0
