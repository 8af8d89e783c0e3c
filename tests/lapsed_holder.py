"""A process of test_lock's lapsed-holder probe: ``lapsed_holder.py ARGS...`` is `prores ARGS...` whose run lock
has a 2 s lease, beats every 0.2 s and poses as a holder on another host, so that a taker judges it by its lease
alone (a stopped process on this host would count as alive)."""

import functools
import sys

import prores.launcher.train
from prores.cli import main
from prores.run.lock import RunLock

LEASE = 2.0

if __name__ == "__main__":
    prores.launcher.train.RunLock = functools.partial(RunLock, lease=LEASE, heartbeat=0.2,
                                                      host="elsewhere/boot/pid:[0]")
    sys.exit(main(sys.argv[1:]))
