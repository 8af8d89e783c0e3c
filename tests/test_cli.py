"""First contact with `prores train`: what a user sees, on good input and on bad.

Bad input is found before any process group or DeepSpeed starts, said in one
line under every launcher with no traceback, and leaves no run directory; a
finished run is left as it is; the output is the run's, not DeepSpeed's.
"""

import hashlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing import event_accumulator

from conftest import NO_SLURM, deepspeed_launcher, need, run_cli, slurm_available, srun, torchrun, train_args
from prores.config import key_docs, load_config
from prores.cli import default_run_dir
from prores.run.progress import Progress
from prores.run.summary import Summary

ROOT = Path(__file__).resolve().parent.parent
STEPS = 6
TINY = ("model.num_layers=2", "model.seq_length=32", "train.micro_batch_size=4", f"train.steps={STEPS}",
        "train.log_interval=2", "train.eval_interval=3", "data.eval_samples=4", "kernels.backend=eager")
DEEPSPEED_START_UP = ("Setting accelerator to CPU", "built successfully", "SEED_LAYERS=", "Using topology:")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny run, with its own (empty) torch extensions directory."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    extensions = tmp_path_factory.mktemp("torch_extensions")
    proc = run_cli(*train_args(run_dir, TINY), TORCH_EXTENSIONS_DIR=str(extensions))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, proc, extensions


def test_a_run_prints_its_own_lines_not_deepspeeds_and_builds_no_op(finished):
    _, proc, extensions = finished
    out = proc.stdout + proc.stderr
    assert not [line for line in DEEPSPEED_START_UP if line in out]
    assert list(extensions.rglob("*")) == []  # DeepSpeed's CPU op is never compiled
    # not a terminal: one plain line every log_interval, never a carriage return
    progress = [line.split(":")[0] for line in proc.stdout.splitlines() if line.startswith("step ") and "/" in line]
    assert progress == [f"step {s}/{STEPS}" for s in (2, 4, 6)] and "\r" not in proc.stdout


def test_verbose_shows_deepspeeds_start_up(tmp_path):
    proc = run_cli(*train_args(tmp_path / "run", TINY + ("train.steps=1",)), "--verbose")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Using topology:" in proc.stdout and "[INFO]" in proc.stdout and "DeepSpeed info: version=" in proc.stdout


def strict_json(text: str) -> dict:
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_the_summary_is_strict_json_with_the_whole_run_rate(finished):
    run_dir, proc, _ = finished
    summary = strict_json((run_dir / "summary.json").read_text())
    cfg = load_config(None, TINY)
    tokens = STEPS * cfg.train.micro_batch_size * cfg.model.seq_length
    assert summary["steps"] == STEPS and summary["train_seconds"] > 0
    assert summary["tokens_per_sec"] == pytest.approx(tokens / summary["train_seconds"], rel=1e-12)
    assert summary["steady_tokens_per_sec"] > 0
    assert (f"({summary['tokens_per_sec']:.0f} tokens/s over the run,"
            f" {summary['steady_tokens_per_sec']:.0f} in the steady state)") in proc.stdout


def test_nan_is_written_as_null(tmp_path):
    Summary(status="diverged", steps=3, final_valid_loss=float("nan"), unigram_entropy=3.3, parameters=10,
            tokens_per_sec=None, steady_tokens_per_sec=None, train_seconds=0.0).write(tmp_path)
    summary = strict_json((tmp_path / "summary.json").read_text())
    assert summary["final_valid_loss"] is None and summary["tokens_per_sec"] is None


def test_a_finished_run_says_so_and_is_left_as_it_was(finished):
    run_dir, _, _ = finished
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    proc = run_cli(*train_args(run_dir, TINY))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [f"run directory {run_dir} is finished (step {STEPS}, train.steps={STEPS});"
                                        " its summary.json is left as it was. A longer run needs a new --run-dir."]
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_recompute_may_change_on_resume(finished):
    """It changes memory, not numbers: a finished run with recompute on is still that finished run."""
    run_dir, _, _ = finished
    proc = run_cli(*train_args(run_dir, TINY + ("model.recompute=block",)))
    assert proc.returncode == 0 and f"run directory {run_dir} is finished" in proc.stdout, proc.stderr[-3000:]


def test_the_default_run_directory_follows_the_changes_not_their_spelling():
    assert default_run_dir(None, load_config()) == Path("runs/tiny")
    assert default_run_dir(None, load_config(None, ("model.num_layers=12",))) == Path("runs/tiny")  # the default
    deeper = default_run_dir(None, load_config(None, ("model.num_layers=4", "train.steps=20")))
    assert deeper.parent == Path("runs") and deeper.name.startswith("tiny-") and len(deeper.name) == len("tiny-") + 8
    assert default_run_dir(None, load_config(None, ("train.steps=20", "model.num_layers=4"))) == deeper
    assert default_run_dir(None, load_config(None, ("model.num_layers=5", "train.steps=20"))) != deeper
    assert default_run_dir("depth/48.yaml", load_config("depth/48.yaml")) == Path("runs/48")


def test_without_run_dir_another_model_gets_its_own_directory(tmp_path):
    """Before: `--set model.num_layers=...` tried to resume runs/tiny and failed late."""
    first = run_cli("train", *[a for o in TINY for a in ("--set", o)], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    other = run_cli("train", *[a for o in TINY + ("model.num_layers=3",) for a in ("--set", o)], cwd=tmp_path)
    assert other.returncode == 0, other.stderr[-3000:]
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(names) == 2 and all(n.startswith("tiny-") for n in names)
    assert "resuming" not in other.stdout


def bad_inputs(tmp_path, finished_run) -> dict:
    """name: (overrides, --run-dir, the message)"""
    (tmp_path / "one-play.txt").write_text("To be, or not to be, that is the question.\n" * 50)
    (tmp_path / "empty.txt").write_text("")
    fresh = tmp_path / "fresh"
    return {
        "other model": (TINY + ("model.num_layers=3",), finished_run,
                        f"checkpoint {finished_run}/checkpoints/global_step{STEPS} holds a different model"
                        " (model.num_layers: 2 -> 3); resume with the same model.* keys, or start a new --run-dir."),
        "other schedule": (TINY + ("prores.T=7",), finished_run,
                           f"checkpoint {finished_run}/checkpoints/global_step{STEPS} holds another ProRes schedule"
                           " (prores.T: 20.0 -> 7.0); resume with the same prores.* keys, or start a new --run-dir."),
        "missing data": (TINY + ("data.paths=[/nonexistent/x]",), fresh,
                         "data.paths: '/nonexistent/x' is neither a file nor an indexed dataset"),
        "one document": (TINY + (f"data.corpus={tmp_path / 'one-play.txt'}",), fresh,
                         "has 1 sequence(s) (a document each, or 1 MB of a long text file): its valid split (5%"),
        "no text": (TINY + (f"data.corpus={tmp_path / 'empty.txt'}",), fresh,
                    f"no text in {tmp_path / 'empty.txt'}: 1 empty document(s)"),
        # 50 lines of 43 bytes and <eod>: (2151 - 1) // 32 = 67 windows
        "eval set too small": (TINY + (f"data.eval.tiny={tmp_path / 'one-play.txt'}", "data.eval_samples=68"),
                               fresh, f"data.eval.tiny ({tmp_path / 'one-play.txt'}) has 67 sequences, fewer than"
                                      " data.eval_samples=68"),
        "eval samples not whole batches": (TINY + ("data.eval_samples=6",), fresh,
                                           "data.eval_samples=6 is not a multiple of the evaluation batch of 4"),
    }


@pytest.mark.parametrize("case", ["other model", "other schedule", "missing data", "one document", "no text",
                                  "eval set too small", "eval samples not whole batches"])
def test_bad_input_is_one_line_before_anything_starts(finished, tmp_path, case):
    overrides, run_dir, message = bad_inputs(tmp_path, finished[0])[case]
    existed = run_dir.exists()
    proc = run_cli(*train_args(run_dir, overrides), timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.count(message) == 1 and proc.stderr.startswith("prores: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and "kernels.backend" not in proc.stdout
    assert run_dir.exists() == existed  # a failed start leaves no run directory behind


def test_bad_input_is_found_before_the_process_group(finished, tmp_path):
    """In a fresh interpreter: every case raises from train() with neither torch.distributed nor
    DeepSpeed's communication started (so no op build and no start-up lines, whatever the cache)."""
    cases = bad_inputs(tmp_path, finished[0])
    code = """if True:
        import sys, json
        import deepspeed.comm
        import torch.distributed as dist
        from pathlib import Path
        from prores.config import load_config
        from prores.errors import UsageError
        from prores.launcher.train import train
        for overrides, run_dir, message in json.loads(sys.argv[1]):
            try:
                train(load_config(None, tuple(overrides)), Path(run_dir))
            except UsageError as exc:
                assert message in str(exc), (message, str(exc))
            else:
                raise AssertionError(f"no error for {overrides}")
        print(dist.is_initialized(), deepspeed.comm.is_initialized())
    """
    arg = json.dumps([[list(o), str(d), m] for o, d, m in cases.values()])
    proc = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["False", "False"]


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "srun"])
def test_under_a_launcher_a_usage_error_is_its_message_without_a_traceback(finished, tmp_path, launcher):
    if launcher == "srun":
        need(slurm_available(), NO_SLURM)
    command = {"torchrun": torchrun, "deepspeed": deepspeed_launcher, "srun": srun}[launcher](2)
    overrides, run_dir, message = bad_inputs(tmp_path, finished[0])["other model"]
    proc = run_cli(*train_args(run_dir, overrides), launcher=command, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and out.count(message) == 1, out[-3000:]
    assert "Traceback" not in out and "ChildFailedError" not in out, out[-3000:]


def test_a_problem_one_rank_finds_stops_every_rank_at_once(tmp_path):
    """Rank 1 alone lacks its data (as a file missing on one node would be): the ranks agree on the
    preflight verdict, so rank 0 says rank 1's problem once and every rank exits, none waits in a
    collective for its peer (which would hang until the process group's 30-minute timeout)."""
    wrapper = tmp_path / "rank1-lacks-data.sh"
    wrapper.write_text('extra=(); if [ "$RANK" = 1 ]; then extra=(--set "data.corpus=$1/missing.txt"); fi\n'
                       'shift; exec python -m prores "$@" "${extra[@]}"\n')
    launcher = ["torchrun", "--standalone", "--nproc_per_node=2", "--no-python", "bash", str(wrapper), str(tmp_path)]
    started = time.monotonic()
    proc = run_cli(*train_args(tmp_path / "run", TINY + ("data.eval_samples=8",)), launcher=launcher, timeout=600)
    out = proc.stdout + proc.stderr
    assert time.monotonic() - started < 120
    assert proc.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert out.count(f"prores: error: rank 1 of 2: data.corpus: '{tmp_path}/missing.txt' is neither a file") == 1


def test_prores_config_shows_every_key_value_default_and_meaning():
    proc = run_cli("config", "--set", "model.num_layers=48", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert sorted(lines) == sorted(d.key for d in key_docs())
    assert lines["model.num_layers"].split()[1] == "48" and lines["model.num_layers"].endswith("[default 12]")
    assert "blocks (L)" in lines["model.num_layers"] and "[default" not in lines["model.hidden_size"]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def metrics(loss):
    return {"train/loss": loss, "train/lr": 1e-3, "train/tokens_per_sec": 100.0}


@pytest.mark.parametrize("stream,bar", [(io.StringIO, True), (Terminal, False)], ids=["log", "terminal-no-bar"])
def test_progress_in_a_log_is_a_plain_line_every_log_interval(stream, bar):
    out = stream()
    progress = Progress(total=7, initial=0, log_interval=3, bar=bar, stream=out)
    for step in range(1, 8):
        progress.step(step, metrics(float(step)))
    progress.write("step 7: valid loss 1.0")
    progress.close()
    assert out.getvalue().splitlines() == [
        "step 3/7: loss 3.0000, lr 1.00e-03, 100 tokens/s", "step 6/7: loss 6.0000, lr 1.00e-03, 100 tokens/s",
        "step 7/7: loss 7.0000, lr 1.00e-03, 100 tokens/s", "step 7: valid loss 1.0"]


def test_progress_on_a_terminal_is_a_bar():
    out = Terminal()
    progress = Progress(total=4, initial=0, log_interval=1, bar=True, stream=out)
    for step in range(1, 5):
        progress.step(step, metrics(1.5))
    progress.close()
    assert "\r" in out.getvalue() and "4/4" in out.getvalue() and "loss=1.500" in out.getvalue()


def test_progress_of_other_ranks_is_silent():
    out = Terminal()
    progress = Progress(total=4, initial=0, log_interval=1, bar=True, quiet=True, stream=out)
    progress.step(1, metrics(1.0))
    progress.write("x")
    assert out.getvalue() == ""


def test_analyze_says_what_it_needs(tmp_path):
    proc = run_cli("analyze", str(tmp_path), timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"prores: error: {tmp_path} is not a run directory (no config.yaml)" in proc.stderr


def test_a_resume_refuses_another_sample_schedule(finished, tmp_path):
    """train.steps and the global batch fix Megatron's sample order and the LR schedule."""
    run_dir = finished[0]
    for overrides, now in (((f"train.steps={STEPS + 4}",), f"train.steps={STEPS + 4} and 4"),
                           (("train.micro_batch_size=2",), f"train.steps={STEPS} and 2"),
                           (("train.micro_batch_size=2", "train.grad_accum=2"), None)):
        proc = run_cli(*train_args(run_dir, TINY + overrides), timeout=300)
        if now is None:  # the same 4 samples a step, micro-batched otherwise: fine (and finished)
            assert proc.returncode == 0 and "is finished" in proc.stdout, proc.stderr[-2000:]
            continue
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert (f"belongs to a run of train.steps={STEPS} with global batches of 4 samples; this run has {now}."
                in proc.stderr), proc.stderr


def test_the_summary_says_what_a_report_needs(finished):
    run_dir = finished[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg_text = (run_dir / summary["config"]).read_text()
    assert summary["config_sha256"] == hashlib.sha256(cfg_text.encode()).hexdigest()
    cfg = load_config(run_dir / "config.yaml")
    m, vocab = cfg.model, 384  # 258 padded to a multiple of 128
    # embedding + per block (q, k, v, o, SwiGLU fc1 (2 x ffn), fc2, two RMSNorm gains) + final norm + head
    per_block = 4 * m.hidden_size ** 2 + 3 * m.hidden_size * m.ffn_hidden_size + 2 * m.hidden_size
    assert summary["parameters"] == vocab * m.hidden_size * 2 + m.num_layers * per_block + m.hidden_size
    events = event_accumulator.EventAccumulator(str(run_dir))
    events.Reload()
    valid = {e.step: e.value for e in events.Scalars("valid/loss")}
    best = min(valid, key=valid.get)
    assert (summary["best_valid_step"], summary["best_valid_loss"]) == (best, pytest.approx(valid[best], rel=1e-6))
