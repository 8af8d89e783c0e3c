"""How a run reports its steps, and a sweep its cells: a tqdm bar on a terminal, plain lines in a log.

A log file (Slurm's ``.out``, a pipe) gets one line every ``log_interval``
steps and never a carriage return; ``logging.progress_bar: false`` gives the
plain lines on a terminal too. Only the process that owns the loss reports.
"""

from __future__ import annotations

import sys
from typing import Optional


class Progress:
    def __init__(self, total: int, initial: int, log_interval: int, bar: bool, quiet: bool = False, stream=None,
                 desc: str = "train", unit: str = "it"):
        self.total, self.log_interval, self.quiet = total, log_interval, quiet
        self.stream = stream or sys.stdout
        self._bar = None
        if bar and not quiet and self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, file=self.stream)

    def advance(self, done: int, line: str, postfix: Optional[dict] = None) -> None:
        """``done`` of ``total`` are done and ``line`` tells of the last one: a bar shows ``postfix`` beside
        it, or without one ``line`` above it; a log gets ``line`` every ``log_interval``."""
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
            if postfix is not None:
                self._bar.set_postfix(postfix)
            else:
                self.write(line)
        elif done % self.log_interval == 0 or done == self.total:
            self.write(line)

    def step(self, step: int, metrics: dict) -> None:
        """``step`` optimizer steps are done; ``metrics`` are those of the last one."""
        loss, lr, rate = metrics["train/loss"], metrics["train/lr"], metrics["train/tokens_per_sec"]
        self.advance(step, f"step {step}/{self.total}: loss {loss:.4f}, lr {lr:.2e}, {rate:.0f} tokens/s",
                     postfix=dict(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:.0f}"))

    def write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        elif not self.quiet:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
