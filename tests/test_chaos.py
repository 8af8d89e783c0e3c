"""benchmarks/chaos.py in small, in a file of its own so that a second pytest worker runs it beside
test_faults.py."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import child_env

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_the_chaos_benchmark_short_a_2_rank_run_survives_three_faults_of_three_kinds(tmp_path):
    """benchmarks/chaos.py in small: a kill, a hang and a preemption at random steps; it exits 0 only when the
    faulted run's every loss and final validation loss equal the unfaulted run's."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--faults", "3", "--seed", "2",
                           "--ranks", "2", "--tp", "1", "--pp", "2", "--kinds", "kill,stop,term", "--steps", "200",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=1500, env=child_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "3 faults injected (kill 1, stop 1, term 1)" in out, out
    assert "recovered: every fault; the run is bitwise the unfaulted one" in out
    # a killed rank's peer fails at once in gloo (a rank lost), or waits on it until its bound (a hang); a hang in
    # a save leaves a half-written checkpoint to set aside
    seen = re.search(r"detected: hang (\d+), rank lost (\d+), preemption 1, damaged checkpoint [01], failed save 0;"
                     r" restarts 2", out)
    assert seen and int(seen[1]) + int(seen[2]) == 2 and int(seen[1]) >= 1, out
    assert "goodput 0." in out
