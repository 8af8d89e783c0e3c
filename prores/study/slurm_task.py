"""`python -m prores.study.slurm_task CELLS.jsonl INDEX`, run by slurm/sweep.sbatch in each array task:
records the task (as `prores sweep --runner slurm` did when it submitted it, for an array submitted by
hand) for `prores sweep status` and prints the cell's run directory and its
`prores train` arguments, NUL-separated, for the shell. With ``--run-dir`` (slurm/sweep-eval.sbatch) it
only prints the run directory."""

import os
import sys
from pathlib import Path

from prores.study.state import record
from prores.study.sweep import read_cells


def main(cells_file: str, index: str, *flags: str) -> None:
    sweep_dir = Path(cells_file).parent
    cell = next(c for c in read_cells(sweep_dir) if c.index == int(index))
    if "--run-dir" in flags:
        sys.stdout.write(cell.run_dir)
        return
    record(sweep_dir, cell, job=f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}")
    args = cell.train_args()
    sys.stdout.write("\0".join([cell.run_dir, *args[:args.index("--run-dir")]]) + "\0")


if __name__ == "__main__":
    main(*sys.argv[1:])
