"""Files that other processes, on this host or another, may read at any moment: whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional


def write_atomic(path: Path, text: str, held: Optional[Callable[[], bool]] = None) -> bool:
    """Write a temporary beside ``path``, flush it to disk, then rename it over ``path`` (atomic on POSIX
    file systems, NFS and Lustre included): a reader sees the old file or the new one, never a part. With
    ``held`` (a run lock's holder publishing), the rename happens only if ``held()`` is still true just before
    it; else the temporary is removed and False returned: a holder that lapsed while it wrote publishes nothing."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    if held is not None and not held():
        tmp.unlink(missing_ok=True)
        return False
    os.replace(tmp, path)
    return True


class Careful:
    """Writes that must never end their caller (a watchdog, a run's records): a failed one (a full disk, a
    directory gone) is said once per kind, ``say(line)``, and given up; the caller goes on."""

    def __init__(self, say):
        self.say, self.failed = say, set()

    def __call__(self, what: str, write) -> bool:
        try:
            write()
            return True
        except OSError as exc:
            if what not in self.failed:
                self.failed.add(what)
                self.say(f"prores: warning: cannot write {what} ({exc.strerror or exc}); going on without it")
            return False
