"""One trainer per run directory: ``RUN/lock``, taken by rank 0 in preflight and held for the run's life.

Shared file systems (NFS, Lustre) are the case it is built for, so it rests on two things they
guarantee and nothing else:

* ``open(O_CREAT | O_EXCL)`` and ``rename`` are atomic (NFSv3 and later, Lustre): of two processes
  creating the lock at once exactly one succeeds;
* a file's modification time set to "now" (``utime`` without a time) is set by the file server, so
  two such times are comparable whatever the clocks of the hosts that set them.

No ``flock``/``fcntl`` lock is needed (NFSv3 without lockd, Lustre mounted ``localflock`` or
``noflock`` do not provide a shared one). The lock file names its holder: host, process id, the
process's start time, and since when. It is stale, and taken over with a message, when

* its holder ran on this host (same host name, boot and pid namespace) and that process is gone or
  is another process with the same id (its start time differs);
* its holder ran on another host and its heartbeat (the file's modification time, touched every
  ``HEARTBEAT_S`` seconds by a thread of the holder) is older than ``LEASE_S`` seconds: the host
  or its process died. A holder on another host whose heartbeat is younger is waited for until it
  either beats (alive: refused) or its lease runs out (taken over).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

from prores.errors import UsageError

LOCK = "lock"
HEARTBEAT_S = 10.0
LEASE_S = 60.0


class RunDirectoryInUse(UsageError):
    """Another trainer holds the run directory."""


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> Optional[str]:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat field 22); None if there is none.
    A pid can be reused, a (pid, start) pair cannot within one boot."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # after the command name, which may hold spaces and ')'


def this_host() -> str:
    """Host name, boot and pid namespace: a pid means the same process only where all three agree."""
    pid_ns = os.readlink("/proc/self/ns/pid") if os.path.exists("/proc/self/ns/pid") else ""
    return f"{socket.gethostname()}/{_read('/proc/sys/kernel/random/boot_id')}/{pid_ns}"


@dataclass(frozen=True)
class Holder:
    host: str  # this_host() of the holder
    pid: int
    start: Optional[str]  # process_start(pid)
    since: str  # UTC, ISO 8601

    @classmethod
    def me(cls) -> "Holder":
        return cls(this_host(), os.getpid(), process_start(os.getpid()),
                   time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host.split('/')[0]} since {self.since}"

    def on_this_host(self) -> bool:
        return self.host == this_host()

    def gone_from_this_host(self) -> bool:
        """On this host: its process is gone (or the pid is another process's now)."""
        return process_start(self.pid) != self.start


def read_holder(path: Path) -> Optional[Holder]:
    try:
        return Holder(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def heartbeat_age(path: Path) -> Optional[float]:
    """Seconds since the lock's last heartbeat, both times set by the file server: a probe file is
    touched now beside it and the two modification times compared."""
    probe = path.with_name(f".{path.name}-clock-{os.getpid()}")
    try:
        probe.touch()
        os.utime(probe)
        return probe.stat().st_mtime - path.stat().st_mtime
    except OSError:
        return None  # the lock went away meanwhile
    finally:
        probe.unlink(missing_ok=True)


def live_holder(run_dir: Path) -> Optional[Holder]:
    """The trainer holding ``run_dir``, if it is alive as far as can be told without waiting: on this
    host by its process, on another by its lease. For status tools; a trainer starting uses
    :class:`RunLock`."""
    path = Path(run_dir) / LOCK
    holder = read_holder(path)
    if holder is None:
        return None
    if holder.on_this_host():
        return None if holder.gone_from_this_host() else holder
    age = heartbeat_age(path)
    return holder if age is not None and age < LEASE_S else None


def in_use(path: Path, holder: Holder) -> RunDirectoryInUse:
    return RunDirectoryInUse(
        f"run directory {path.parent} is in use by another trainer: {holder.describe()} ({path}). Wait for it"
        f" to finish, stop it (kill -TERM {holder.pid} on its host), or give this run another --run-dir.")


def refuse_a_live_holder_here(run_dir: Path) -> None:
    """Refuse at once if a trainer alive on this host holds ``run_dir``, before a second `prores train` spends
    seconds loading torch. An early answer only: :class:`RunLock` decides (a holder on another host, a race)."""
    path = Path(run_dir) / LOCK
    holder = read_holder(path)
    if holder is not None and holder.on_this_host() and not holder.gone_from_this_host():
        raise in_use(path, holder)


class RunLock:
    """``with RunLock(run_dir, say):`` or :meth:`acquire` / :meth:`release`."""

    def __init__(self, run_dir: Path, say: Callable[[str], None] = print):
        self.path, self.say = Path(run_dir) / LOCK, say
        self.mine: Optional[Holder] = None
        self._stop = threading.Event()
        self._beat: Optional[threading.Thread] = None

    def acquire(self) -> None:
        """Take the lock, taking over a stale one; :class:`RunDirectoryInUse` naming a live holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while not self._create():
            holder = read_holder(self.path)
            if holder is None:  # being written or released, or its writer died before it wrote a word
                age = heartbeat_age(self.path)
                if age is not None and age > LEASE_S:
                    self._take_over(None, "an unreadable lock")
                time.sleep(0.2)
                continue
            if not self._stale(holder):
                raise in_use(self.path, holder)
            self._take_over(holder, f"a trainer that is gone ({holder.describe()})")
        self._beat = threading.Thread(target=self._heartbeat, name="prores-run-lock", daemon=True)
        self._beat.start()

    def _create(self) -> bool:
        me = Holder.me()
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(asdict(me)))
            fh.flush()
            os.fsync(fh.fileno())
        self.mine = me
        return True

    def _stale(self, holder: Holder) -> bool:
        if holder.on_this_host():
            return holder.gone_from_this_host()
        try:
            beat = self.path.stat().st_mtime
        except FileNotFoundError:
            return True  # released meanwhile: nothing to take over, look again
        while (age := heartbeat_age(self.path)) is not None and age < LEASE_S:
            time.sleep(min(1.0, LEASE_S - age))
            try:
                if self.path.stat().st_mtime != beat:
                    return False  # it beat: alive
            except FileNotFoundError:
                return True
        return True

    def _take_over(self, holder: Optional[Holder], what: str) -> None:
        """Move the stale lock aside, atomically: if another process replaced it meanwhile, put that
        one back and let the caller look again."""
        aside = self.path.with_name(f"{LOCK}.stale-{os.getpid()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if read_holder(aside) != holder:
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
        else:
            self.say(f"taking over the lock of {what}: {self.path}")
        aside.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                return

    def release(self) -> None:
        """Give the lock back if it is still this process's."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        if self.mine is not None and read_holder(self.path) == self.mine:
            self.path.unlink(missing_ok=True)
        self.mine = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
