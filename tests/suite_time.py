"""Where the suite's wall time goes, printed after pytest's own --durations: seconds per test file (setup,
call and teardown summed, module fixtures included) and, under pytest-xdist, each worker's busy seconds
and how long it sat idle at the end. With ``--dist loadfile`` a worker takes the next file when it ends
one, so a long file handed out last leaves the other worker idle while it runs: the idle time says so."""

from __future__ import annotations

import collections
import time

_START = time.monotonic()
_FILE_SECONDS: dict[str, float] = collections.defaultdict(float)
_WORKER_BUSY: dict[str, float] = collections.defaultdict(float)
_WORKER_LAST: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    _FILE_SECONDS[report.nodeid.split("::")[0]] += report.duration
    node = getattr(report, "node", None)  # set on the xdist controller: the worker the report came from
    if node is not None:
        worker = node.workerinput["workerid"]
        _WORKER_BUSY[worker] += report.duration
        _WORKER_LAST[worker] = time.monotonic()


def pytest_terminal_summary(terminalreporter, config) -> None:
    if hasattr(config, "workerinput") or not _FILE_SECONDS:  # a worker: the controller prints
        return
    end = time.monotonic()
    write = terminalreporter.write_line
    terminalreporter.section("seconds per test file")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        write(f"{seconds:8.1f} s  {path}")
    write(f"{sum(_FILE_SECONDS.values()):8.1f} s  in all, {end - _START:.1f} s of wall time")
    for worker in sorted(_WORKER_BUSY):
        write(f"{worker}: busy {_WORKER_BUSY[worker]:.1f} s, idle for the last {end - _WORKER_LAST[worker]:.1f} s")
