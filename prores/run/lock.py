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

What keeps it to one holder (issue 26), each with a test in tests/test_lock.py:

* The holder's heartbeat survives transient errors (a file briefly missing on NFS, a full quota): it
  retries every second. A holder that has not renewed for half its lease says so in :meth:`RunLock.lost`,
  and the trainer stops at its next step while the lease still holds (a checkpoint, one line): it never
  goes on past a lease it could not renew. A holder that finds another's name in the file has lost it, and
  so has one whose lease ran out (:meth:`RunLock.lapsed`): it writes nothing more, not even a checkpoint.
  A checkpoint's publication (its manifest, then ``latest``) and each removal by retention ask again just
  before the rename or the removal, and so does each TensorBoard event before it reaches the writer's thread
  (:class:`prores.monitor.tensorboard.RunWriter`), so a holder stopped mid-save or mid-picture (SIGSTOP, a
  frozen VM) publishes nothing once continued. What remains is the microseconds between that question and
  the rename: no POSIX file system offers a rename fenced by a lease, so no trainer on one can close it.
* A takeover happens under ``RUN/lock.takeover`` (created ``O_EXCL``, held for milliseconds), judging the
  lock again there, so two takers cannot both act on one stale lock; it moves the lock aside and removes
  it only if the moved file is the very one it judged (same inode and holder), else it puts it back.
* A holder releases only while its lease is certain; a lapsed one leaves the file for the next taker.
* A failed probe (the file written to read the file server's clock) is never evidence of staleness:
  the holder counts as alive, and a trainer that cannot judge says why and stops.
"""

from __future__ import annotations

import json
import math
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


class ProbeFailed(OSError):
    """The probe file that reads the file server's clock could not be written: the age is unknown."""


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
    def me(cls, host: Optional[str] = None) -> "Holder":
        return cls(host or this_host(), os.getpid(), process_start(os.getpid()),
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


def identity(path: Path) -> Optional[tuple]:
    """The file at ``path`` as (device, inode, heartbeat, holder): a lock replaced by another has another
    inode, one that beat has another modification time; None if there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, read_holder(path)


def heartbeat_age(path: Path) -> Optional[float]:
    """Seconds since the lock's last heartbeat, both times set by the file server: a probe file is
    touched now beside it and the two modification times compared. None: the lock is gone.
    :class:`ProbeFailed`: the probe could not be written (a full disk, a quota), so the age is unknown."""
    probe = path.with_name(f".{path.name}-clock-{os.getpid()}")
    try:
        probe.touch()
        os.utime(probe)
        now = probe.stat().st_mtime
    except OSError as exc:
        raise ProbeFailed(exc.errno, f"cannot write {probe} to read the file server's clock: {exc.strerror}") from exc
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return None


def live_holder(run_dir: Path) -> Optional[Holder]:
    """The trainer holding ``run_dir``, if it is alive as far as can be told without waiting: on this
    host by its process, on another by its lease (alive when its age cannot be read). For status tools;
    a trainer starting uses :class:`RunLock`."""
    path = Path(run_dir) / LOCK
    holder = read_holder(path)
    if holder is None:
        return None
    if holder.on_this_host():
        return None if holder.gone_from_this_host() else holder
    try:
        age = heartbeat_age(path)
    except ProbeFailed:
        return holder
    return holder if age is not None and age < LEASE_S else None


def in_use(path: Path, holder: Holder) -> RunDirectoryInUse:
    return RunDirectoryInUse(
        f"run directory {path.parent} is in use by another trainer: {holder.describe()} ({path}). Wait for it"
        f" to finish, stop it (kill -TERM {holder.pid} on its host), or give this run another --run-dir.")


def cannot_judge(path: Path, exc: OSError) -> UsageError:
    return UsageError(f"cannot tell whether the holder of {path} is alive: {exc.strerror}. Free space (or quota)"
                      f" on {path.parent}'s file system and start again.")


def refuse_a_live_holder_here(run_dir: Path) -> None:
    """Refuse at once if a trainer alive on this host holds ``run_dir``, before a second `prores train` spends
    seconds loading torch. An early answer only: :class:`RunLock` decides (a holder on another host, a race)."""
    path = Path(run_dir) / LOCK
    holder = read_holder(path)
    if holder is not None and holder.on_this_host() and not holder.gone_from_this_host():
        raise in_use(path, holder)


class RunLock:
    """``with RunLock(run_dir, say):`` or :meth:`acquire` / :meth:`release`; :meth:`lost` while held.

    ``lease`` and ``heartbeat`` (seconds) are the module's for a run; ``host`` stands in for this host in the
    tests (a holder "on another host")."""

    def __init__(self, run_dir: Path, say: Callable[[str], None] = print, lease: float = LEASE_S,
                 heartbeat: float = HEARTBEAT_S, host: Optional[str] = None):
        self.path, self.say = Path(run_dir) / LOCK, say
        self.mutex = self.path.with_name(f"{LOCK}.takeover")
        self.lease, self.heartbeat, self.host = lease, heartbeat, host
        self.mine: Optional[Holder] = None
        self.renewed = 0.0  # time.monotonic() just before the last heartbeat that reached the file server
        self.taken: Optional[str] = None  # who took the lock from this holder
        self._stop = threading.Event()
        self._beat: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ taking it

    def acquire(self) -> None:
        """Take the lock, taking over a stale one; :class:`RunDirectoryInUse` naming a live holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while self._create() is None:
            seen = identity(self.path)
            if seen is None:
                continue  # released meanwhile: try again
            holder = seen[3]
            if holder is None:  # being written or released, or its writer died before it wrote a word
                if self._age_or_refuse(self.path) > self.lease:
                    self._take_over(seen, "an unreadable lock")
                time.sleep(0.2)
                continue
            if not self._stale(holder):
                raise in_use(self.path, holder)
            self._take_over(seen, f"a trainer that is gone ({holder.describe()})")
        self.renewed, self.taken = time.monotonic(), None
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="prores-run-lock", daemon=True)
        self._beat.start()

    def _create(self, path: Optional[Path] = None) -> Optional[Holder]:
        """Create ``path`` (the lock) naming this process, or None if it exists."""
        me = Holder.me(self.host)
        try:
            fd = os.open(path or self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(asdict(me)))
            fh.flush()
            os.fsync(fh.fileno())
        if path is None:
            self.mine = me
        return me

    def _age_or_refuse(self, path: Path) -> float:
        """The age of ``path``'s heartbeat (infinite if it is gone); a failed probe refuses to judge."""
        try:
            age = heartbeat_age(path)
        except ProbeFailed as exc:
            raise cannot_judge(path, exc) from None
        return math.inf if age is None else age

    def _stale(self, holder: Holder) -> bool:
        """Whether ``holder`` of the lock is gone: by its process on this host, by its lease on another
        (waiting until it beats or its lease runs out)."""
        if holder.on_this_host() or (self.host is not None and holder.host == self.host):
            return holder.gone_from_this_host()
        try:
            beat = self.path.stat().st_mtime
        except FileNotFoundError:
            return True  # released meanwhile: nothing to take over, look again
        while (age := self._age_or_refuse(self.path)) < self.lease:
            time.sleep(min(1.0, self.heartbeat, self.lease - age))
            try:
                if self.path.stat().st_mtime != beat:
                    return False  # it beat: alive
            except FileNotFoundError:
                return True
        return True

    def _take_over(self, judged: tuple, what: str) -> None:
        """Remove the lock judged stale (``judged``: its :func:`identity`), under the takeover mutex: judged
        again there, moved aside, and removed only if the moved file is that very one; else put back."""
        taker = self._hold_mutex()
        if taker is None:
            return
        try:
            if identity(self.path) != judged:
                return  # another taker got there first, or the holder released: look again
            aside = self.path.with_name(f"{LOCK}.stale-{os.getpid()}")
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                return
            if identity(aside) == judged:
                self.say(f"taking over the lock of {what}: {self.path}")
                aside.unlink(missing_ok=True)
                return
            try:  # not the one judged (a holder released and another created meanwhile): put it back
                os.link(aside, self.path)
                aside.unlink()
            except FileExistsError:  # and a third created one meanwhile: leave the moved lock to its holder,
                pass                 # whose next heartbeat finds the lock is no longer its own and stops
        finally:
            if read_holder(self.mutex) == taker:
                self.mutex.unlink(missing_ok=True)

    def _hold_mutex(self) -> Optional[Holder]:
        """Hold ``lock.takeover`` (its holder record), or None if another live taker kept it for a whole lease
        (the caller looks again). A mutex is held for milliseconds: its holder is gone if its process is (this
        host), or after a lease (another)."""
        deadline = time.monotonic() + self.lease
        while (taker := self._create(self.mutex)) is None:
            seen = identity(self.mutex)
            if seen is None:
                continue
            holder = seen[3]
            if holder is not None and (holder.on_this_host() or holder.host == self.host):
                abandoned = holder.gone_from_this_host()
            else:
                abandoned = self._age_or_refuse(self.mutex) > self.lease
            if abandoned and identity(self.mutex) == seen:
                self.mutex.unlink(missing_ok=True)
                continue
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        return taker

    # ------------------------------------------------------------------ holding it

    def _heartbeat(self) -> None:
        """Renew the lease every ``heartbeat`` seconds; after a failed renewal, try again every second. Renew
        only a lock that names this holder, and only while the lease holds (past it, another may hold it)."""
        wait = self.heartbeat
        while not self._stop.wait(wait):
            now = time.monotonic()
            holder = read_holder(self.path)
            if holder is not None and holder != self.mine:
                self.taken = holder.describe()
                return
            if now - self.renewed >= self.lease:
                return  # lapsed: lapsed() says so; touching the file now could renew another's lock
            try:
                if holder is None:
                    raise FileNotFoundError(self.path)  # missing or unreadable for now: not renewed
                os.utime(self.path)
                self.renewed, wait = now, self.heartbeat
            except OSError:
                wait = min(1.0, self.heartbeat)

    def lapsed(self) -> bool:
        """Another took the lock, or its lease ran out unrenewed (another may have taken it since): from here on
        this holder must write nothing into the run directory."""
        return bool(self.taken) or (self.mine is not None and time.monotonic() - self.renewed >= self.lease)

    def lost(self) -> Optional[str]:
        """Why this holder must stop, or None while it holds the lock: another took it, the lease lapsed, or it
        was not renewed for half its length (stopping then, while it still holds, leaves time for a checkpoint)."""
        if self.taken:
            return f"the run directory's lock {self.path} was taken over by {self.taken}"
        unrenewed = time.monotonic() - self.renewed
        if self.mine is not None and unrenewed >= self.lease:
            return (f"the run directory's lock {self.path} was not renewed for {unrenewed:.0f} s, past its lease of"
                    f" {self.lease:.0f} s: another trainer may hold it now")
        if self.mine is not None and unrenewed >= self.lease / 2:
            return (f"the run directory's lock {self.path} could not be renewed for {unrenewed:.0f} s (its lease is"
                    f" {self.lease:.0f} s): is its file system reachable?")
        return None

    def release(self) -> None:
        """Give the lock back if it is still this process's and its lease certain (a lapsed one may be being
        taken over: the file is left to the taker)."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        if (self.mine is not None and not self.taken and time.monotonic() - self.renewed < self.lease - self.heartbeat
                and read_holder(self.path) == self.mine):
            self.path.unlink(missing_ok=True)
        self.mine = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
