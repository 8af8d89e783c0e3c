"""Preprocessing throughput (MB/s) with 1 and with 2 workers, side by side.

Input: the packaged Shakespeare plays written as jsonl, repeated to about
``--mb`` megabytes, tokenized byte-level (or with ``--tokenizer PATH``).

Usage: python benchmarks/preprocess.py [--mb 40] [--tokenizer byte]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from prores.data.corpus import load_documents
from prores.data.preprocess import preprocess


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=40)
    parser.add_argument("--tokenizer", default="byte")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="prores-pp-"))
    src = work / "plays.jsonl"
    plays = load_documents("shakespeare")
    written = 0
    with src.open("w") as fh:
        while written < args.mb * 1e6:
            for text in plays:
                line = json.dumps({"text": text}) + "\n"
                fh.write(line)
                written += len(line)
    rates = {}
    for workers in (1, 2):
        start = time.perf_counter()
        report = preprocess([str(src)], str(work / f"w{workers}"), tokenizer=args.tokenizer, workers=workers,
                            progress=False)
        rates[workers] = report.bytes / (time.perf_counter() - start) / 1e6
    print(f"input {written / 1e6:.1f} MB jsonl, tokenizer {args.tokenizer}")
    print(f"MB/s: 1 worker {rates[1]:.1f}, 2 workers {rates[2]:.1f}, ratio {rates[2] / rates[1]:.2f}")


if __name__ == "__main__":
    main()
