"""A process of test_lock's stress test: ``lock_stress_worker.py RUN_DIR LOG SEED`` (imports nothing heavy, so
that a process that died is replaced within a fraction of a second)."""

import os
import random
import sys
import time

from prores.run.lock import RunDirectoryInUse, RunLock

STRESS_LEASE = 2.0  # s; a holder stops writing after half of it unrenewed, so 1 s of margin for a write


def stress_worker(run_dir: str, log: str, seed: int) -> None:
    """One of the stress test's processes: take the lock, append its acquisition's tag to the log a few times
    (each time only after asking the lock whether it still holds), then release it, or die holding it, or hang
    (its heartbeat stops) until it knows it lost it; again and again. Half the workers pose as another host,
    whose dead or hung holders are taken over by their lease; the others' dead holders by their pid (a hung
    process on this host holds its lock for as long as it lives: the hang watchdog ends it)."""
    rng = random.Random(seed)
    host = f"stress-{seed}/boot/pid:[0]" if seed % 2 else None
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    say = lambda m: os.write(fd, f"# {m}\n".encode())  # noqa: E731
    for n in range(10_000):
        lock = RunLock(run_dir, say=say, lease=STRESS_LEASE, heartbeat=0.1, host=host)
        try:
            lock.acquire()
        except RunDirectoryInUse:
            time.sleep(rng.uniform(0, 0.03))
            continue
        fate = rng.random()
        if fate < 0.05 and host is None:
            fate = 0.07
        if fate < 0.05:
            lock._stop.set()  # hangs: no more heartbeats
        for _ in range(rng.randint(1, 4) if fate >= 0.05 else 1000):
            if lock.lost():
                break
            os.write(fd, f"{os.getpid()}-{n}\n".encode())
            time.sleep(rng.uniform(0, 0.02))
        if fate < 0.05:
            continue  # abandoned after it knew it lost it: another takes it over when the lease runs out
        if fate < 0.10:
            os._exit(0)  # dies holding it
        lock.release()


if __name__ == "__main__":
    stress_worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))
