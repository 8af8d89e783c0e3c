"""Running a sweep's cells: each cell is its own `prores train` process (or Slurm array task).

``local``: ``jobs`` cells at a time on this machine, each in its own session,
so that only the runner gets a terminal's signals: on SIGTERM, SIGHUP or
Ctrl-C it starts nothing more and stops the cells cleanly (SIGTERM to each
cell's process group: a checkpoint at the next step, exit) before it says so,
since after a hang-up its own output fails (EIO) and must not end it; a second
signal kills the groups; it exits non-zero. ``slurm``: one ``sbatch --array`` per group of
cells that need the same resources; each task runs ``slurm/sweep.sbatch``,
which reads its line of ``cells.jsonl`` and runs ``slurm/train.sbatch``
(signal forwarding, checkpoint, requeue). Either way a re-run skips finished
cells, leaves alone those whose trainer or Slurm task is alive, and resumes the
others.
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
from typing import Optional

import prores
from prores.config import load_config
from prores.errors import UsageError
from prores.model.size import block_flops_per_token
from prores.parallel.rendezvous import own_world
from prores.run.progress import Progress
from prores.run.summary import read_summary
from prores.study.state import ALIVE, cell_state, finished, record, record_exit
from prores.study.sweep import Cell

SLURM_DIR = Path(prores.__file__).resolve().parents[1] / "slurm"  # slurm/ of the checkout prores runs from


def inductor_cache(sweep_dir: Path) -> str:
    """Where the sweep's cells keep Inductor's compiled graphs and kernels: in the sweep directory, so a shape
    is compiled once per sweep, by the first cell that meets it, on every node that shares the directory,
    and the cache outlives /tmp. Always this one: torch writes its default into the environment of any
    process that compiled, so an inherited TORCHINDUCTOR_CACHE_DIR says nothing of what the user chose."""
    return str(sweep_dir.resolve() / "inductor-cache")


def _cell_env(jobs: int, sweep_dir: Path) -> dict:
    """Each cell a world of its own, sharing the cores and the sweep's compilation cache."""
    env = own_world(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    env["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache(sweep_dir)
    return env


def to_start(sweep_dir: Path, cells: list[Cell]) -> list[Cell]:
    """The cells a run of the sweep starts: neither finished nor alive (a trainer holds the run directory,
    or a Slurm task of it is queued or running). Says which it leaves alone."""
    states = {c.name: None if finished(c) else cell_state(sweep_dir, c).state for c in cells}
    done = [c for c in cells if states[c.name] is None]
    alive = [c for c in cells if states[c.name] in ALIVE]
    if done:
        print(f"prores sweep: {len(done)} of {len(cells)} cells finished already; skipping them", flush=True)
    if alive:
        names = ", ".join(f"{c.name}" + ("" if states[c.name] == "running" else f" ({states[c.name]})")
                          for c in alive)
        print(f"prores sweep: {len(alive)} cell{'s are' if len(alive) > 1 else ' is'} running already ({names});"
              f" {'they are' if len(alive) > 1 else 'it is'} not started again", flush=True)
    return [c for c in cells if c not in done and c not in alive]


def longest_first(cells: list[Cell]) -> list[Cell]:
    """The cells by their training cost, the dearest first (ties in grid order): with ``--jobs`` N the deep cells
    do not end up last with cores idle beside them. The cost is the blocks' FLOPs (prores.model.size) times the
    tokens a run trains on; the embedding and head, the same at every depth, are left out."""
    def cost(cell: Cell) -> int:
        cfg = load_config(cell.base, cell.overrides)
        tokens = cfg.train.steps * cfg.train.global_batch(1) * cfg.model.seq_length
        return cfg.model.num_layers * block_flops_per_token(cfg.model) * tokens
    return sorted(cells, key=cost, reverse=True)


class Unfailing:
    """A text stream whose writes cannot fail: after a terminal's hang-up every write to it fails with EIO, and
    the runner must go on supervising its cells (signalling them, reaping them) rather than die of a print."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except (OSError, ValueError):  # EIO, a closed pipe, a closed file
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name):
        return getattr(self.stream, name)


def signal_cells(procs, sig: int) -> None:
    """``sig`` to each cell's whole process group (each cell is a session of its own: its launcher's workers
    too), a cell that already ended left alone."""
    for proc in procs:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass


class StopSignals:
    """SIGTERM, SIGHUP and SIGINT (Ctrl-C) ask the runner to stop its cells cleanly; a second one kills them.
    SIGINT and SIGHUP that were ignored when the runner started (a background job's, `nohup`'s) stay
    ignored: the Unix convention, a terminal's Ctrl-C or hang-up must not reach them. SIGTERM never is."""

    def __init__(self):
        self.received: list[int] = []
        self._previous: dict = {}

    def __enter__(self) -> "StopSignals":
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            if sig != signal.SIGTERM and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            self._previous[sig] = signal.signal(sig, lambda signum, frame: self.received.append(signum))
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def keep_niceness(pid: int) -> None:
    """Give a cell started in a session of its own (``start_new_session``) the runner's niceness against
    other sessions too. Under Linux's autogroup scheduling a new session is a new scheduling group of
    nice 0, and a process's own nice weighs only inside its group: without this, ``nice prores sweep``
    would take its full share of the CPU from every other session. Best effort (no autogroup, no /proc)."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(os.getpriority(os.PRIO_PROCESS, 0)))
    except OSError:
        pass


def needs_eval(cell: Cell) -> bool:
    """A completed cell whose spec asks for an evaluation it has not had, of its final checkpoint."""
    summary = read_summary(Path(cell.run_dir)) or {}
    return bool(cell.eval) and summary.get("status") == "completed" and not (
        Path(cell.run_dir) / "eval" / str(summary["steps"]) / "results.json").is_file()


def run_local(sweep_dir: Path, cells: list[Cell], jobs: int = 1) -> int:
    """0 when no cell failed (a diverged cell is a result, not a failure); 128 + the signal that stopped it.
    A cell that completes is evaluated next, as its own `prores eval` process, if the spec has ``eval``."""
    sys.stdout, sys.stderr = Unfailing(sys.stdout), Unfailing(sys.stderr)  # for the life of the runner
    todo = longest_first(to_start(sweep_dir, cells))
    evals = [c for c in cells if c not in todo and needs_eval(c)]
    if evals:
        print(f"prores sweep: {len(evals)} completed cells still to evaluate (the spec's `eval`)", flush=True)
    logs = sweep_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    done = len(cells) - len(todo)
    progress = Progress(len(cells), done, log_interval=1, bar=True, desc="cells", unit="cell")
    running: dict[str, tuple[Cell, subprocess.Popen, str]] = {}
    states: Counter = Counter()

    def start(cell: Cell, command: str) -> None:
        args = cell.train_args() if command == "train" else cell.eval_args()
        with open(logs / f"{cell.name}.log", "a") as log:
            proc = subprocess.Popen([sys.executable, "-m", "prores", command, *args], stdout=log,
                                    stderr=subprocess.STDOUT, env=_cell_env(jobs, sweep_dir), start_new_session=True)
        keep_niceness(proc.pid)
        if command == "train":
            record(sweep_dir, cell, pid=proc.pid)
        running[cell.name] = (cell, proc, command)

    def reap() -> None:
        nonlocal done
        for name, (cell, proc, command) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[name]
            if command == "eval":
                states["eval failed" if proc.returncode else "evaluated"] += 1
                progress.write(f"{cell.name}: evaluated" if proc.returncode == 0 else
                               f"{cell.name}: evaluation failed (exit {proc.returncode}; see logs/{cell.name}.log)")
                continue
            record_exit(sweep_dir, cell, proc.returncode)
            state = cell_state(sweep_dir, cell).state
            states[state] += 1
            done += 1
            loss = (read_summary(Path(cell.run_dir)) or {}).get("final_valid_loss")
            progress.advance(done, f"[{done}/{len(cells)}] {cell.name}: {state}"
                             + (f", valid loss {loss:.4f}" if loss else ""))
            if needs_eval(cell):
                evals.append(cell)

    with StopSignals() as signals:
        while (todo or evals or running) and not signals.received:
            while (evals or todo) and len(running) < jobs and not signals.received:  # nothing starts after one
                start(*((evals.pop(0), "eval") if evals else (todo.pop(0), "train")))
            reap()
            time.sleep(0.2)
        if signals.received:
            sig = signals.received[0]
            signal_cells([proc for _, proc, _ in running.values()], signal.SIGTERM)  # first: a print may fail
            n = len(running)
            print(f"prores sweep: {signal.Signals(sig).name}: stopping {n} running cell{'s' if n != 1 else ''} at"
                  " the next step (a checkpoint each); a second signal kills them", flush=True)
            killed = False
            while running:
                if len(signals.received) > 1 and not killed:
                    signal_cells([proc for _, proc, _ in running.values()], signal.SIGKILL)
                    killed = True
                reap()
                time.sleep(0.2)
            progress.close()
            print("prores sweep: stopped; run the same command again to resume", flush=True)
            return 128 + sig
    progress.close()
    print("prores sweep: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) if states else
          "prores sweep: nothing to run", flush=True)
    return 1 if states["failed"] or states["eval failed"] else 0


def _sbatch(sweep_dir: Path, group: list[Cell], script: str, job_name: str) -> list[str]:
    r = group[0].slurm
    command = ["sbatch", "--parsable", f"--array={','.join(str(c.index) for c in group)}",
               f"--job-name={job_name}", f"--nodes={r['nodes']}",
               f"--ntasks-per-node={r['ntasks_per_node']}", f"--gpus-per-node={r['gpus_per_node']}",
               f"--cpus-per-task={r['cpus_per_task']}", f"--time={r['time']}"]
    if r["partition"]:
        command.append(f"--partition={r['partition']}")
    return command + [*r["extra"], f"--output={sweep_dir.resolve() / 'logs'}/%x-%A_%a.out",
                      f"--export=ALL,PRORES_SLURM_DIR={SLURM_DIR},PRORES_PYTHON={sys.executable},"
                      f"TORCHINDUCTOR_CACHE_DIR={inductor_cache(sweep_dir)}",
                      str(SLURM_DIR / script)]


def _groups(cells: list[Cell]) -> list[list[Cell]]:
    """The cells by the resources they ask for."""
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(json.dumps(cell.slurm, sort_keys=True), []).append(cell)
    return list(groups.values())


def sbatch_commands(sweep_dir: Path, cells: list[Cell], cells_file: Path) -> list[tuple[list[str], list[Cell]]]:
    """One `sbatch --array` per group of cells with the same resources, and the group."""
    if not (SLURM_DIR / "sweep.sbatch").is_file():
        raise UsageError(f"{SLURM_DIR / 'sweep.sbatch'} not found: the Slurm runner needs the prores checkout's"
                         " slurm/ directory next to the package.")
    return [(_sbatch(sweep_dir, group, "sweep.sbatch", f"prores-{sweep_dir.name}") + [str(cells_file.resolve())],
             group) for group in _groups(cells)]


def eval_command(sweep_dir: Path, group: list[Cell], cells_file: Path, after: Optional[str]) -> list[str]:
    """The evaluation array of ``group`` (slurm/sweep-eval.sbatch): task i evaluates cell i, once training
    task i of array ``after`` has ended well (``aftercorr``), or now."""
    command = _sbatch(sweep_dir, group, "sweep-eval.sbatch", f"prores-eval-{sweep_dir.name}")
    if after:
        command.insert(3, f"--dependency=aftercorr:{after}")
    args = group[0].eval_args()
    return command + [str(cells_file.resolve()), *args[1:]]


def run_slurm(sweep_dir: Path, cells: list[Cell], cells_file: Path, dry_run: bool = False) -> int:
    """Submit the cells to start as job arrays; each array task is recorded as submitted (queued). With an
    ``eval`` block, each array gets an evaluation array that runs after it, task by task, and the finished cells
    not evaluated yet get one of their own."""
    todo = to_start(sweep_dir, cells)
    unevaluated = [c for c in cells if c not in todo and needs_eval(c)]
    if not todo and not unevaluated:
        print("prores sweep: every cell is finished, queued or running; nothing to submit")
        return 0
    if not dry_run:
        (sweep_dir / "logs").mkdir(parents=True, exist_ok=True)

    def submit(command: list[str], what: str = "") -> str:
        if dry_run:
            print(shlex.join(command))
            return "JOB"
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise UsageError(f"`{shlex.join(command)}` failed: {done.stderr.strip()}")
        job = done.stdout.strip().split(";")[0]
        print(f"prores sweep: submitted job {job} ({command[2]}{what})", flush=True)
        return job

    for command, group in sbatch_commands(sweep_dir, todo, cells_file):
        job = submit(command)
        if not dry_run:
            for cell in group:
                record(sweep_dir, cell, job=f"{job}_{cell.index}")
        if group[0].eval:
            submit(eval_command(sweep_dir, group, cells_file, after=job), ", the evaluation after it")
    for group in _groups(unevaluated):
        submit(eval_command(sweep_dir, group, cells_file, after=None), ", evaluations")
    return 0
