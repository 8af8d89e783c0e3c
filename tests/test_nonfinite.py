"""A step whose loss or gradient norm is not finite: `train.on_nonfinite` stop (a divergence, exit 3) or skip
(its update dropped and counted, a divergence after more than `train.max_skipped` in a row), in fp32 and bf16.

The runs use a learning rate of 1e30: step 0's update is finite but throws the weights to ~1e30, and from
step 1 on every gradient norm is infinite (the loss itself stays finite, saturated at 5.95)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from conftest import run_cli, train_args
from prores.config import load_config
from prores.launcher.builders import model_pieces, prores_schedule
from prores.monitor.tensorboard import read_scalars
from prores.parallel.consolidate import consolidated_weights
from prores.run.callbacks import EXIT_DIVERGED, StopWhenNonFinite

BLOW_UP = ("model.num_layers=2", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.seq_length=32",
           "train.micro_batch_size=4", "data.eval_samples=8", "kernels.backend=eager", "train.log_interval=1",
           "train.eval_interval=2", "optim.lr=1e30", "optim.warmup_steps=0", "logging.progress_bar=false",
           "checkpoint.interval=1", "checkpoint.keep_last=0")


class Trainer(SimpleNamespace):
    """What StopWhenNonFinite reads of a trainer."""

    def request_stop(self, status, message=""):
        self.stopped = (status, message)


def test_skipped_steps_in_a_row_reset_and_too_many_diverge():
    cfg = load_config(None, ("train.on_nonfinite=skip", "train.max_skipped=2", "train.log_interval=1"))
    logged = {}
    trainer = Trainer(cfg=cfg, stopped=None, checkpoints=SimpleNamespace(newest_manifest=lambda: None),
                      writer=SimpleNamespace(loss_scalars=lambda values, step: logged.update({step: values})))
    check = StopWhenNonFinite()
    nan = math.nan
    for step, loss in enumerate([1.0, nan, nan, 1.0, nan, nan, nan]):
        check.post_step(trainer, step, {"train/loss": loss, "train/grad_norm": 1.0})
        assert (trainer.stopped is None) == (step < 6), step
    assert [logged[s]["train/skipped_steps"] for s in range(7)] == [0, 1, 2, 2, 3, 4, 5]
    assert check.diverged_at == 6 and trainer.stopped[1].startswith("diverged at step 6 (3 non-finite steps in a row)")


def weights(run_dir, step, cfg):
    pieces = [p.cls(**p.kwargs) for p in model_pieces(cfg, 258, prores_schedule(cfg))]
    return consolidated_weights(run_dir / "checkpoints" / f"global_step{step}", pieces)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_skip_drops_each_non_finite_update_and_counts_it(tmp_path, precision, world_of_one):
    overrides = BLOW_UP + ("train.steps=4", "train.on_nonfinite=skip", "train.max_skipped=10",
                           f"train.precision={precision}")
    proc = run_cli(*train_args(tmp_path, overrides), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4
    scalars = read_scalars(tmp_path, lambda t: t.startswith("train/"))
    assert scalars["train/skipped_steps"] == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0}
    assert math.isfinite(scalars["train/grad_norm"][0]) and all(
        math.isinf(scalars["train/grad_norm"][s]) for s in (1, 2, 3))
    cfg = load_config(None, overrides)
    after_step_0, at_the_end = weights(tmp_path, 1, cfg), weights(tmp_path, 4, cfg)
    for name, w in after_step_0.items():  # steps 1-3 changed no weight
        assert torch.equal(w, at_the_end[name]), name
    init = {f"{i:02d}/{n}": p for i, piece in enumerate(p.cls(**p.kwargs) for p in model_pieces(cfg, 258,
            prores_schedule(cfg))) for n, p in piece.named_parameters()}
    assert not torch.equal(after_step_0["01/mlp.linear_fc1.weight"], init["01/mlp.linear_fc1.weight"])


@pytest.mark.slow
def test_more_skipped_in_a_row_than_allowed_is_a_divergence(tmp_path):
    proc = run_cli(*train_args(tmp_path, BLOW_UP + ("train.steps=8", "train.on_nonfinite=skip",
                                                    "train.max_skipped=2")), timeout=600)
    assert proc.returncode == EXIT_DIVERGED, proc.stderr[-3000:]
    assert "diverged at step 3 (3 non-finite steps in a row)" in proc.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["diverged_at"], summary["steps"]) == ("diverged", 3, 4)
    assert read_scalars(tmp_path, lambda t: t == "train/skipped_steps")["train/skipped_steps"] == {
        0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0}
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("global_step*")) == [
        "global_step1", "global_step2", "global_step3"]  # nothing after the divergence is saved


@pytest.mark.slow
def test_a_bf16_run_diverges_like_an_fp32_one(tmp_path):
    proc = run_cli(*train_args(tmp_path, BLOW_UP + ("train.steps=4", "train.precision=bf16")), timeout=600)
    assert proc.returncode == EXIT_DIVERGED, proc.stderr[-3000:]
    assert proc.stdout.count("diverged at step 1: loss") == 1 and "Traceback" not in proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["diverged_at"]) == ("diverged", 1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("global_step*")) == ["global_step1"]
