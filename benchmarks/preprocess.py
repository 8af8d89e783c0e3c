"""Preprocessing throughput (MB/s) with 1 and with 2 workers, side by side.

Input: the packaged Shakespeare plays written as jsonl, repeated to about
``--mb`` megabytes, tokenized byte-level (or with ``--tokenizer PATH``).

Usage: python benchmarks/preprocess.py [--mb 40] [--tokenizer byte]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from prores.data.corpus import SHAKESPEARE, corpus_files


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=40)
    parser.add_argument("--tokenizer", default="byte")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="prores-pp-"))
    src = work / "plays.jsonl"
    plays = [f.read_text() for f in corpus_files(SHAKESPEARE)]
    written = 0
    with src.open("w") as fh:
        while written < args.mb * 1e6:
            for text in plays:
                line = json.dumps({"text": text}) + "\n"
                fh.write(line)
                written += len(line)
                if written >= args.mb * 1e6:
                    break
    rates = {}
    for workers in (1, 2):  # each a fresh `prores preprocess`, as a user runs it (a fork after torch's
        # thread pools started, in a process that already ran one arm, could deadlock its workers)
        out = subprocess.run([sys.executable, "-m", "prores", "preprocess", str(src), "--output-prefix",
                              str(work / f"w{workers}"), "--tokenizer", args.tokenizer, "--workers", str(workers)],
                             capture_output=True, text=True, check=True).stdout
        rates[workers] = float(re.search(r"([\d.]+) MB/s with", out).group(1))
    print(f"input {written / 1e6:.1f} MB jsonl, tokenizer {args.tokenizer}")
    print(f"MB/s: 1 worker {rates[1]:.1f}, 2 workers {rates[2]:.1f}, ratio {rates[2] / rates[1]:.2f}")


if __name__ == "__main__":
    main()
