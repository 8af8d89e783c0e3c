"""Checkpoints that survive preemption: DeepSpeed's files, a manifest, fallback and retention.

``RUN/checkpoints/global_step{N}/`` holds what ``engine.save_checkpoint`` writes
(weights per layer, ZeRO optimizer shards, the client state: data position and
config; DeepSpeed adds the step and the LR schedule), each rank's RNG states
(``rng/rank{R}.pt``, :mod:`prores.run.rng`) and, written last by rank 0 once every rank has finished,
``manifest.json``: the size and CRC32 of every other file, and the run's
parallel layout. A directory without a manifest, or whose files disagree with
it, is not a checkpoint: resume says so, sets it aside as
``global_step{N}.damaged`` (never deleting it) and takes the previous one.
``latest`` (DeepSpeed's pointer) is replaced atomically after the manifest.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

from prores.run import rng
from prores.run.files import write_atomic

MANIFEST = "manifest.json"
_TAG = re.compile(r"^global_step(\d+)$")


def tag_of(step: int) -> str:
    return f"global_step{step}"


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files(tag_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(tag_dir)) for p in tag_dir.rglob("*") if p.is_file() and p.name != MANIFEST)


# deepspeed 0.19.8's engine.save_checkpoint: one barrier before any file is written, one after the last
# (tests/test_faults.py checks the count, so a DeepSpeed that changes it fails there, not in a cluster's save)
SAVE_BARRIERS = 2


@contextlib.contextmanager
def _counted_barriers():
    """``[n]``: the barriers this rank passed inside the block (deepspeed.comm's, which the engine calls)."""
    import deepspeed.comm

    passed, barrier = [0], deepspeed.comm.barrier

    def counted(*args, **kwargs):
        result = barrier(*args, **kwargs)
        passed[0] += 1
        return result

    deepspeed.comm.barrier = counted
    try:
        yield passed
    finally:
        deepspeed.comm.barrier = barrier


def _gather(local: dict) -> dict:
    """Union of every rank's dict (each rank works on its own share of the files)."""
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    return {k: v for part in parts for k, v in part.items()}


def _checksums(tag_dir: Path, files: list[str]) -> dict[str, list[int]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = {f: [(tag_dir / f).stat().st_size, _crc32(tag_dir / f)] for f in files[rank::world]}
    return _gather(mine)


def _problem(tag_dir: Path) -> Optional[str]:
    """Why ``tag_dir`` is not a usable checkpoint, or None. Collective: every rank checks a share."""
    try:
        manifest = json.loads((tag_dir / MANIFEST).read_text())
        expected = manifest["files"]
    except (OSError, ValueError, KeyError) as exc:
        return f"no valid {MANIFEST} ({type(exc).__name__}): it was never completed"
    rank, world = dist.get_rank(), dist.get_world_size()
    local = {}
    for name in sorted(expected)[rank::world]:
        path = tag_dir / name
        if not path.is_file():
            local[name] = "is missing"
        elif path.stat().st_size != expected[name][0]:
            local[name] = f"has {path.stat().st_size} bytes, {expected[name][0]} were written"
        elif _crc32(path) != expected[name][1]:
            local[name] = "does not match its CRC32"
    bad = _gather(local)
    return "; ".join(f"{name} {why}" for name, why in sorted(bad.items())) or None


@dataclass
class Found:
    step: int
    path: Path
    manifest: dict


class Checkpoints:
    """The checkpoints of one run directory (``RUN/checkpoints``). All methods except :meth:`exist`,
    :meth:`complete` and :meth:`newest_manifest` are collective."""

    def __init__(self, run_dir: Path, keep_last: int = 0, keep_every: int = 0, keep_steps=(),
                 held: Callable[[], bool] = lambda: True):
        self.root, self.keep_last, self.keep_every = run_dir / "checkpoints", keep_last, keep_every
        self.keep_steps = set(keep_steps)
        self.held = held  # rank 0: still the run lock's holder? Asked before each publish and each removal

    def _tags(self) -> list[tuple[int, Path]]:
        """(step, dir) of every global_step{N} directory, newest first."""
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if p.is_dir() and (m := _TAG.match(p.name))]
        return sorted(found, reverse=True)

    def exist(self) -> bool:
        return bool(self._tags())

    def complete(self) -> list[Found]:
        """Every checkpoint with a readable manifest, oldest first, its files not verified: what one
        process can learn of the run without a process group (:meth:`newest_good` verifies, collectively)."""
        found = []
        for step, path in reversed(self._tags()):
            try:
                found.append(Found(step, path, json.loads((path / MANIFEST).read_text())))
            except (OSError, ValueError):
                continue
        return found

    def newest_manifest(self) -> Optional[Found]:
        complete = self.complete()
        return complete[-1] if complete else None

    def save(self, engine, step: int, client_state: dict, meta: dict, say=print) -> Optional[Path]:
        """Write, then publish: the manifest and ``latest`` appear only after every rank is done, and only while
        rank 0 still holds the run lock (``held``); a save whose holder lapsed meanwhile publishes and prunes
        nothing, and is None on every rank. A save that
        fails for want of space (or any other error of the file system) is removed again, said in one line
        (``say``, rank 0), and None returned: the previous checkpoints stay as they were, and the run goes on
        and tries again at the next interval. A rank that fails inside DeepSpeed's save (a full disk on some
        ranks only) first meets the barriers its peers pass there, so every rank reaches the same verdict."""
        tag = tag_of(step)
        tag_dir = self.root / tag
        with _counted_barriers() as passed:
            try:
                engine.save_checkpoint(str(self.root), tag=tag, client_state=client_state, save_latest=False)
                (tag_dir / "rng").mkdir(parents=True, exist_ok=True)
                torch.save(rng.states(), tag_dir / "rng" / f"rank{dist.get_rank()}.pt")
                failed = {}
            except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as a RuntimeError
                failed = {dist.get_rank(): str(getattr(exc, "strerror", None) or exc).splitlines()[0]}
        for _ in range(SAVE_BARRIERS - passed[0]):  # a rank that failed inside the save meets its peers' barriers
            dist.barrier()
        failed = _gather(failed)  # also: every rank's files are on disk
        if failed:
            self._not_saved(tag_dir, step, failed, say)
            return None
        sums = _checksums(tag_dir, _files(tag_dir))
        unpublished = {}
        if dist.get_rank() == 0:
            manifest = json.dumps({"step": step, **meta, "files": sums}, indent=1)
            if write_atomic(tag_dir / MANIFEST, manifest, self.held) and write_atomic(self.root / "latest", tag,
                                                                                       self.held):
                self._prune(keep=step)
            else:
                unpublished = {0: "the run lock lapsed"}
        return None if _gather(unpublished) else tag_dir  # the gather: also the barrier after publishing

    def _not_saved(self, tag_dir: Path, step: int, failed: dict, say) -> None:
        rank, why = min(failed.items())
        previous = self.newest_manifest()
        if dist.get_rank() == 0:
            needed = (sum(size for size, _ in previous.manifest["files"].values()) if previous else
                      sum(p.stat().st_size for p in tag_dir.rglob("*") if p.is_file()))
            shutil.rmtree(tag_dir, ignore_errors=True)
            free = shutil.disk_usage(self.root).free
            kept = f"the previous checkpoint {previous.path} is intact" if previous else "there is no checkpoint yet"
            # torch.save reports a short write, not ENOSPC: the space it needed against the space there is
            full = "no space left" if free < needed else "a write failed"
            say(f"checkpoint of step {step} not saved: {full} under {self.root} (it needs about"
                f" {needed / 2**20:.2f} MiB, {free / 2**20:.2f} MiB are free; rank {rank}: {why}); {kept}. The run goes"
                " on and tries again at the next checkpoint.")
        dist.barrier()

    def _prune(self, keep: int) -> None:
        """Rank 0: drop what retention does not keep; the newest ``keep_last``, every ``keep_every``-th
        step and the ``keep_steps`` stay (and the one just written, ``keep``)."""
        if self.keep_last == 0:
            return
        for i, (step, path) in enumerate(self._tags()):
            if (step == keep or i < self.keep_last or step in self.keep_steps
                    or (self.keep_every and step % self.keep_every == 0)):
                continue
            if not self.held():  # another holder's checkpoints, maybe
                return
            shutil.rmtree(path, ignore_errors=True)

    def newest_good(self, say) -> Optional[Found]:
        """The newest complete, intact checkpoint; each damaged newer one is reported through
        ``say`` (rank 0) and moved aside."""
        for step, path in self._tags():
            problem = _problem(path)
            if problem is None:
                return Found(step, path, json.loads((path / MANIFEST).read_text()))
            aside = path.with_name(f"{path.name}.damaged")
            n = 1
            while aside.exists():
                n += 1
                aside = path.with_name(f"{path.name}.damaged{n}")
            say(f"warning: checkpoint {path} is damaged ({problem}); set aside as {aside.name},"
                " falling back to the previous checkpoint")
            dist.barrier()
            if dist.get_rank() == 0:
                path.rename(aside)
            dist.barrier()
        return None

    def remove_all(self) -> None:
        """Rank 0 deletes every checkpoint (``--no-resume --overwrite``)."""
        if dist.get_rank() == 0 and self.root.exists():
            shutil.rmtree(self.root)
        dist.barrier()
