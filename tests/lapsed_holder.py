"""A process of test_lock's lapsed-holder probe: ``lapsed_holder.py ARGS...`` is `prores ARGS...` whose run lock
has a 2 s lease, beats every 0.2 s and poses as a holder on another host, so that a taker judges it by its lease
alone (a stopped process on this host would count as alive). It stops itself (SIGSTOP) just before it publishes
its first ``latest`` (its manifest is out, every rank's files are on disk): the moment a takeover hurts most."""

import functools
import os
import signal
import sys
from pathlib import Path

import prores.launcher.train
import prores.run.checkpoint
from prores.cli import main
from prores.run.lock import RunLock

LEASE = 2.0


def stop_before_the_first_latest(write_atomic):
    stopped = []

    def write(path, *args, **kwargs):
        if Path(path).name == "latest" and not stopped:
            stopped.append(path)
            os.kill(os.getpid(), signal.SIGSTOP)
        return write_atomic(path, *args, **kwargs)
    return write


if __name__ == "__main__":
    prores.launcher.train.RunLock = functools.partial(RunLock, lease=LEASE, heartbeat=0.2,
                                                      host="elsewhere/boot/pid:[0]")
    prores.run.checkpoint.write_atomic = stop_before_the_first_latest(prores.run.checkpoint.write_atomic)
    sys.exit(main(sys.argv[1:]))
