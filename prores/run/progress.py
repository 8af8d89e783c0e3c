"""How a run reports its steps: a tqdm bar on a terminal, plain lines in a log.

A log file (Slurm's ``.out``, a pipe) gets one line every ``train.log_interval``
steps and never a carriage return; ``logging.progress_bar: false`` gives the
plain lines on a terminal too. Only the process that owns the loss reports.
"""

from __future__ import annotations

import sys


class Progress:
    def __init__(self, total: int, initial: int, log_interval: int, bar: bool, quiet: bool = False, stream=None):
        self.total, self.log_interval, self.quiet = total, log_interval, quiet
        self.stream = stream or sys.stdout
        self._bar = None
        if bar and not quiet and self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc="train", dynamic_ncols=True, file=self.stream)

    def step(self, step: int, metrics: dict) -> None:
        """``step`` optimizer steps are done; ``metrics`` are those of the last one."""
        loss, lr, rate = metrics["train/loss"], metrics["train/lr"], metrics["train/tokens_per_sec"]
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:.0f}")
        elif step % self.log_interval == 0 or step == self.total:
            self.write(f"step {step}/{self.total}: loss {loss:.4f}, lr {lr:.2e}, {rate:.0f} tokens/s")

    def write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        elif not self.quiet:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
