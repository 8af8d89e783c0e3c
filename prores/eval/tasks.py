"""The offline tasks that ship with prores: lm-evaluation-harness task YAMLs (``configs/eval/``) over the
packaged corpus's held-out text, so that the real harness runs end to end with nothing downloaded.

Held out: the documents (plays) of the validation split of the default ``data.split`` (95,5,0), as
Megatron's builder cuts them, which a run on the packaged corpus never trains on. From them:

* ``prores_lastword`` (LAMBADA-style): each speech of at least ``MIN_WORDS`` words, after the speech before
  it, is a passage; its final word, stripped of punctuation, is the target, and the text before it the
  context.
* ``prores_rolling_ppl`` (WikiText-style): the held-out text in pieces of whole lines, about ``PIECE`` characters
  each, scored whole.

The data is made once per directory, deterministically, as JSONL that the harness reads through its own
``json`` dataset path; the YAMLs are written beside it with their ``{data_dir}`` filled in.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from megatron.core.datasets.blended_megatron_dataset_config import (convert_split_vector_to_split_matrix,
                                                                    parse_and_normalize_split)

from prores.config import PACKAGED_CONFIGS
from prores.data.corpus import SHAKESPEARE, corpus_files
from prores.data.preprocess import Report, iter_items

TASKS = ("prores_lastword", "prores_rolling_ppl")
HELD_OUT_SPLIT = "95,5,0"
MIN_WORDS = 30
PIECE = 2000
SPEAKER = re.compile(r"^\*\*[^*]+\*\*\s*$")  # a speech starts with its speaker's name in bold
LAST_WORD = re.compile(r"^(.*\S)\s+([A-Za-z][A-Za-z']{2,})[^A-Za-z']*$", re.S)


def held_out_texts() -> list[str]:
    """The packaged corpus's validation documents under the default split, as preprocessing reads them."""
    files = corpus_files(SHAKESPEARE)
    begin, end = convert_split_vector_to_split_matrix(parse_and_normalize_split(HELD_OUT_SPLIT))[1]
    held = files[int(round(begin * len(files))):int(round(end * len(files)))]
    return ["".join(text for text, _ in iter_items([f], "text", "skip", Report())) for f in held]


def speeches(text: str) -> list[str]:
    out, current = [], []
    for line in text.splitlines():
        if SPEAKER.match(line):
            if current:
                out.append("\n".join(current).strip())
            current = []
        elif line.strip():
            current.append(line)
    if current:
        out.append("\n".join(current).strip())
    return out


def lastword_docs(texts: list[str]) -> list[dict]:
    docs = []
    for text in texts:
        parts = speeches(text)
        for before, speech in zip([""] + parts, parts):
            match = LAST_WORD.match(speech)
            if match and len(speech.split()) >= MIN_WORDS:
                context = (before + "\n\n" if before else "") + match.group(1)
                docs.append({"context": context, "target": " " + match.group(2)})
    return docs


def rolling_docs(texts: list[str]) -> list[dict]:
    docs = []
    for text in texts:
        piece: list[str] = []
        for line in text.splitlines(keepends=True):
            piece.append(line)
            if sum(map(len, piece)) >= PIECE:
                docs.append({"text": "".join(piece)})
                piece = []
        if piece:
            docs.append({"text": "".join(piece)})
    return docs


def materialize(directory: Path) -> Path:
    """The offline tasks' data and YAMLs in ``directory`` (made once); the harness's ``include_path``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    texts = None
    for task, make in (("prores_lastword", lastword_docs), ("prores_rolling_ppl", rolling_docs)):
        data = directory / f"{task}.jsonl"
        if not data.is_file():
            texts = texts if texts is not None else held_out_texts()
            tmp = data.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(d) + "\n" for d in make(texts)))
            tmp.replace(data)
        template = (PACKAGED_CONFIGS / "eval" / f"{task}.yaml").read_text()
        (directory / f"{task}.yaml").write_text(template.replace("{data_dir}", str(directory.resolve())))
    return directory
