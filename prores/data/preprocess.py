"""`prores preprocess`: jsonl or plain text in, Megatron ``PREFIX.bin`` / ``PREFIX.idx`` out.

Inputs are streamed: jsonl one line at a time, plain text in chunks of lines,
so files larger than memory work. Tokenization runs in a process pool whose
``imap`` keeps input order, so the output does not depend on ``--workers``.
Every document ends with the tokenizer's end-of-document token; an empty
document (no tokens) is skipped and counted, and inputs with no text at all
are an error. A bad jsonl line (invalid JSON, missing key, not a string) is
reported with file and line number and either counted and skipped or fatal.
Outputs are written under private temporary names and renamed at the end: a
failed run leaves nothing behind, and processes that preprocess the same
inputs at once each put whole, identical files in place.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy
import torch
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

from prores.data.tokenizers import load_tokenizer
from prores.errors import UsageError

TEXT_CHUNK_BYTES = 1 << 20  # plain text is tokenized in ~1 MB pieces of whole lines


@dataclass
class Report:
    documents: int = 0
    items: int = 0
    tokens: int = 0
    bytes: int = 0
    empty: int = 0  # documents without a token, skipped
    bad_lines: list[str] = field(default_factory=list)


def _jsonl_items(path: Path, json_key: str, on_bad_line: str, report: Report) -> Iterator[tuple[str, bool]]:
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            report.bytes += len(line.encode("utf-8"))
            try:
                text = json.loads(line)[json_key]
                if not isinstance(text, str):
                    raise TypeError(f"{json_key!r} is {type(text).__name__}, not a string")
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                where = f"{path}:{lineno}: {type(exc).__name__}: {exc}"
                if on_bad_line == "fail":
                    raise UsageError(f"bad jsonl line {where} (pass --on-bad-line skip to skip such lines)") from None
                report.bad_lines.append(where)
                print(f"prores preprocess: skipping bad line {where}", file=sys.stderr)
                continue
            yield text, True


def _text_items(path: Path, report: Report) -> Iterator[tuple[str, bool]]:
    """One document per file, yielded in chunks of whole lines; the last chunk ends the document."""
    chunk: list[str] = []
    size = 0
    markdown = path.suffix == ".md"
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if markdown:  # hard line breaks are two trailing spaces: noise to a language model
                line = line.rstrip() + "\n"
            chunk.append(line)
            size += len(line)
            if size >= TEXT_CHUNK_BYTES:
                report.bytes += size
                yield "".join(chunk), False
                chunk, size = [], 0
    report.bytes += size
    yield "".join(chunk), True


def iter_items(paths: list[Path], json_key: str, on_bad_line: str, report: Report) -> Iterator[tuple[str, bool]]:
    """(text, ends_document) in input order."""
    for path in paths:
        if path.suffix == ".jsonl":
            yield from _jsonl_items(path, json_key, on_bad_line, report)
        else:
            yield from _text_items(path, report)


_worker_tokenizer = None


def _init_worker(spec: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = load_tokenizer(spec)


def _encode(item: tuple[str, bool]) -> tuple[numpy.ndarray, bool]:
    text, ends = item
    return _worker_tokenizer.encode(text).numpy(), ends


def preprocess(inputs: list[str], output_prefix: str, json_key: str = "text", tokenizer: str = "byte",
               workers: int = 1, on_bad_line: str = "skip", progress: bool = True) -> Report:
    paths = [Path(p) for p in inputs]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UsageError(f"input file(s) not found: {', '.join(missing)}")
    tok = load_tokenizer(tokenizer)
    prefix = Path(output_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    private = f"{socket.gethostname()}-{os.getpid()}.tmp"
    tmp_bin, tmp_idx = Path(f"{prefix}.bin.{private}"), Path(f"{prefix}.idx.{private}")
    report, start = Report(), time.perf_counter()
    builder = IndexedDatasetBuilder(str(tmp_bin), dtype=DType.optimal_dtype(tok.vocab_size))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(unit="doc", desc="preprocess", dynamic_ncols=True)
    items = iter_items(paths, json_key, on_bad_line, report)
    try:
        with contextlib.ExitStack() as stack:
            if workers == 1:  # no fork: `prores train` calls this from a process that holds threads
                _init_worker(tokenizer)
                encoded = map(_encode, items)
            else:
                pool = stack.enter_context(multiprocessing.Pool(workers, _init_worker, (tokenizer,)))
                encoded = pool.imap(_encode, items, chunksize=16)
            doc_tokens = 0  # of the document being assembled (a text file arrives in chunks)
            for ids, ends in encoded:
                if ends:
                    if doc_tokens + len(ids) == 0:
                        report.empty += 1
                        continue
                    ids = numpy.append(ids, tok.eod)
                if len(ids):
                    builder.add_item(torch.from_numpy(ids))
                    report.items += 1
                    report.tokens += len(ids)
                    doc_tokens += len(ids)
                if ends:
                    builder.end_document()
                    report.documents += 1
                    doc_tokens = 0
                    if bar is not None:
                        bar.update(1)
        if report.documents == 0:
            raise UsageError(f"no text in {', '.join(inputs)}: {report.empty} empty document(s),"
                             f" {len(report.bad_lines)} bad line(s) skipped; give input with text.")
        builder.finalize(str(tmp_idx))
        os.replace(tmp_bin, f"{prefix}.bin")
        os.replace(tmp_idx, f"{prefix}.idx")
    finally:
        if bar is not None:
            bar.close()
        for tmp in (tmp_bin, tmp_idx):
            tmp.unlink(missing_ok=True)
    elapsed = max(time.perf_counter() - start, 1e-9)
    print(f"prores preprocess: {report.documents} documents, {report.tokens} tokens, {report.empty} empty"
          f" documents and {len(report.bad_lines)} bad lines skipped; {report.documents / elapsed:.1f} docs/s,"
          f" {report.bytes / elapsed / 1e6:.2f} MB/s with {workers} worker(s) -> {prefix}.bin/.idx")
    return report
