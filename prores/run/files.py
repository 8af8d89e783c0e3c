"""Files that other processes, on this host or another, may read at any moment: whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write a temporary beside ``path``, flush it to disk, then rename it over ``path`` (atomic on POSIX
    file systems, NFS and Lustre included): a reader sees the old file or the new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
