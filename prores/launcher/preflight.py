"""What `prores train` checks before DeepSpeed, Megatron or any op build starts.

First rank 0 takes the run directory's lock (:mod:`prores.run.lock`): nothing
else is read or written before it is known that no other trainer holds the
directory. Then every rank checks, on files only, the launch against tp × pp,
the run directory (finished, a checkpoint of another model or layout,
checkpoints under --no-resume) and the data (files, tokenizer, enough of it in
every split); raw text is preprocessed into the run's cache here. Each step's
verdict is agreed by all ranks (:func:`agreed`), so that a problem one rank
finds stops every rank at once, with that rank's message.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, TypeVar

from prores.config import Config, TrainConfig
from prores.data.sources import check_sources, resolve_sources
from prores.data.tokenizers import load_tokenizer
from prores.errors import UsageError
from prores.parallel.rendezvous import launched_as
from prores.parallel.topology import agree
from prores.run.checkpoint import Checkpoints, Found
from prores.run.lock import RunLock
from prores.run.summary import read_summary


T = TypeVar("T")

# keys that change memory, not numbers (the parity tests prove it), so a resume may change them
MAY_CHANGE_ON_RESUME = {"model.recompute"}


@dataclass
class Plan:
    rank: int
    dp: int
    newest: Optional[Found]  # the newest checkpoint to resume from (verified later, by all ranks)
    finished: bool  # the newest checkpoint is at or past train.steps and the summary says completed


def check_resumable(found: Found, cfg: Config, dp: int) -> None:
    """Resuming may change tp, pp and dp (the number of processes), the precision and micro-batching, but not
    the samples per step, train.steps, the model or ProRes. Another layout reads the ZeRO-1 optimizer shards by
    name (prores.parallel.reshard), so both runs need ZeRO-1; without ZeRO only another dp in fp32 resumes
    (every rank holds the whole optimizer state). Refused here, before anything is loaded."""
    saved, config = found.manifest["parallel"], found.manifest["config"]
    was = {"parallel.zero_stage": config.get("parallel", {}).get("zero_stage", 1),
           "train.precision": config.get("train", {}).get("precision", "fp32"),
           "parallel.tp": saved["tp"], "parallel.pp": saved["pp"]}
    now = {"parallel.zero_stage": cfg.parallel.zero_stage, "train.precision": cfg.train.precision,
           "parallel.tp": cfg.parallel.tp, "parallel.pp": cfg.parallel.pp}
    changed = [f"{k} {was[k]} -> {now[k]}" for k in was if was[k] != now[k]]
    zero0 = was["parallel.zero_stage"] == 0
    if saved["dp"] != dp and zero0 and was["train.precision"] == "bf16":
        changed.append(f"dp {saved['dp']} -> {dp}")  # its fp32 masters are cut over dp, and not by name
    if changed and (zero0 or now["parallel.zero_stage"] == 0):
        raise UsageError(
            f"checkpoint {found.path} cannot be resumed exactly here ({'; '.join(changed)}): another layout reads"
            " the ZeRO-1 optimizer shards by name, so both runs need parallel.zero_stage=1, and a ZeRO-0"
            " checkpoint resumes only as it was written (or, in fp32, on another dp). Resume with "
            + " ".join(f"--set {k}={v}" for k, v in was.items()) + ", or start a new --run-dir.")
    saved, now, default = found.manifest["config"], cfg.to_dict(), Config().to_dict()
    for section, what in (("model", "a different model"), ("prores", "another ProRes schedule")):
        was = {**default[section], **saved[section]}  # a key newer than the checkpoint had its default
        changed = [f"{section}.{k}: {was[k]!r} -> {v!r}" for k, v in now[section].items()
                   if was[k] != v and f"{section}.{k}" not in MAY_CHANGE_ON_RESUME]
        if changed:
            raise UsageError(f"checkpoint {found.path} holds {what} ({'; '.join(changed)}); resume with the same"
                             f" {section}.* keys, or start a new --run-dir.")
    known = {k: v for k, v in saved["train"].items() if k in TrainConfig.__dataclass_fields__}
    saved_train = replace(TrainConfig(), **known)  # its global batch by the one formula
    was = (saved_train.steps, saved_train.global_batch(found.manifest["parallel"]["dp"]))
    global_batch = cfg.train.global_batch(dp)
    if was != (cfg.train.steps, global_batch):
        raise UsageError(
            f"checkpoint {found.path} belongs to a run of train.steps={was[0]} with global batches of {was[1]}"
            f" samples; this run has train.steps={cfg.train.steps} and {global_batch}. Megatron's sample order"
            " (shuffled over the epochs those samples span) and the learning-rate schedule depend on both:"
            f" resume with train.steps={was[0]} and micro_batch_size x grad_accum x dp = {was[1]}"
            f" (or train.global_batch_size={was[1]}),"
            " or start a new --run-dir.")


def check_run_dir(cfg: Config, run_dir: Path, resume: bool, overwrite: bool, dp: int) -> Optional[Found]:
    """The checkpoint a resume starts from, if any."""
    cfg.train.accumulation(dp)  # a global batch this world cannot split is bad input before anything runs
    checkpoints = Checkpoints(run_dir)
    if not resume:
        if checkpoints.exist() and not overwrite:
            raise UsageError(f"run directory '{run_dir}' already has checkpoints; without --no-resume `prores train`"
                             " resumes from the newest, --no-resume --overwrite deletes them and starts afresh,"
                             " or pass a new --run-dir.")
        return None
    found = checkpoints.newest_manifest()
    if found is not None:
        check_resumable(found, cfg, dp)
    return found


def completed(run_dir: Path) -> bool:
    return (read_summary(run_dir) or {}).get("status") == "completed"


def agreed(check: Callable[[], T]) -> T:
    """``check()`` on every rank, its verdict agreed: every rank raises the first failing rank's message,
    or every rank goes on with its result. A world of one needs no process group for it."""
    try:
        result, problem = check(), None
    except UsageError as exc:
        result, problem = None, str(exc)
    problem = agree(problem)
    if problem is not None:
        raise UsageError(problem)
    return result


def take_lock(cfg: Config, lock: RunLock) -> None:
    """Rank 0 takes the run directory for this run (:class:`prores.run.lock.RunLock`)."""
    rank, _ = launched_as(cfg.parallel.tp, cfg.parallel.pp)
    if rank == 0:
        lock.acquire()


def preflight(cfg: Config, run_dir: Path, resume: bool = True, overwrite: bool = False) -> Plan:
    rank, dp = launched_as(cfg.parallel.tp, cfg.parallel.pp)
    newest = check_run_dir(cfg, run_dir, resume, overwrite, dp)
    if newest is not None and newest.step >= cfg.train.steps and completed(run_dir):
        return Plan(rank, dp, newest, finished=True)
    load_tokenizer(cfg.data.tokenizer)
    sources = resolve_sources(cfg.data, run_dir / "cache")
    check_sources(sources, cfg.data, seq_length=cfg.model.seq_length, batch=cfg.train.micro_batch_size * dp)
    return Plan(rank, dp, newest, finished=False)


def clean_up_failed_start(run_dir: Path, created: bool, world_size: int) -> None:
    """A start that failed its checks leaves no run directory behind: a world of one removes the one it
    created (it holds at most a data cache), and every rank removes empty ones (another rank may still
    be reading a cache, so launched ranks never delete files)."""
    if created and world_size == 1:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for path in (run_dir / "cache" / "text", run_dir / "cache", run_dir):
        try:
            path.rmdir()
        except OSError:  # not empty, or not there
            pass
