"""From the data config to batches: raw text preprocessed once into the cache, eval sets, read-only data."""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy
import pytest
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset

from prores.config import DataConfig
from prores.data.corpus import shakespeare_files
from prores.data.preprocess import preprocess
from prores.data.sources import build_run_data, cached_prefix
from prores.data.tokenizers import ByteTokenizer

FIXTURES = Path(__file__).parent / "fixtures"
JSONL = FIXTURES / "tiny_corpus.jsonl"


def build(data: DataConfig, cache: Path, micro=4, dp_rank=0, dp_size=1):
    return build_run_data(data, ByteTokenizer(), seq_length=32, micro_batch_size=micro, train_samples=400, seed=7,
                          cache_dir=cache, dp_rank=dp_rank, dp_size=dp_size)


def test_the_default_corpus_goes_through_the_indexed_path(world_of_one, tmp_path):
    prefix = cached_prefix("shakespeare", "byte", "text", tmp_path)
    data = IndexedDataset(prefix)
    plays = ["".join(line.rstrip() + "\n" for line in f.read_text().splitlines()) for f in shakespeare_files()]
    assert len(data.document_indices) - 1 == 38
    assert len(data.sequence_lengths) and int(data.sequence_lengths.sum()) == sum(
        len(p.encode()) + 1 for p in plays)  # every play's cleaned bytes, then <eod>
    first = data.get(0)[:200]  # the first item of play 0 (1 MB chunks of whole lines)
    assert bytes(first.tolist()) == plays[0].encode()[:200]


def test_raw_text_is_preprocessed_once_and_again_when_it_changes(world_of_one, tmp_path):
    src = tmp_path / "corpus.jsonl"
    src.write_text(JSONL.read_text())
    cache = tmp_path / "cache"
    a = cached_prefix(str(src), "byte", "text", cache)
    stamp = os.stat(f"{a}.bin").st_mtime_ns
    assert cached_prefix(str(src), "byte", "text", cache) == a and os.stat(f"{a}.bin").st_mtime_ns == stamp
    src.write_text(JSONL.read_text() + '{"text": "one more document"}\n')
    b = cached_prefix(str(src), "byte", "text", cache)
    old, new = IndexedDataset(a), IndexedDataset(b)
    assert b != a and len(new.document_indices) == len(old.document_indices) + 1


def test_markdown_hard_breaks_are_dropped(tmp_path):
    (tmp_path / "play.md").write_text("Exit.  \nEnter  Ghost.   \n")
    preprocess([str(tmp_path / "play.md")], str(tmp_path / "p"), progress=False)
    data = IndexedDataset(str(tmp_path / "p"))  # keep it alive: its items are views of its mmap
    assert data[0].tolist() == list(b"Exit.\nEnter  Ghost.\n") + [256]


def test_eval_sets_from_text_and_from_a_read_only_prefix(world_of_one, tmp_path):
    data_dir = tmp_path / "data"
    preprocess([str(JSONL)], str(data_dir / "docs"), progress=False)
    before = sorted(data_dir.iterdir())
    docs = IndexedDataset(str(data_dir / "docs"))  # alive while its mmap'd arrays are read
    jsonl_windows = (int(docs.sequence_lengths.sum()) - 1) // 32
    samples = jsonl_windows // 4 * 4  # the smaller set, in whole batches of 4
    cfg = DataConfig(corpus=str(JSONL), split="80,20,0", eval_samples=samples,
                     eval={"text": str(FIXTURES / "tiny_corpus.txt"), "docs": str(data_dir / "docs")})
    run = build(cfg, tmp_path / "cache")
    assert sorted(data_dir.iterdir()) == before  # nothing written next to the data
    stream = list((FIXTURES / "tiny_corpus.txt").read_bytes()) + [256]
    # the file's 32-token windows, none twice: 17441 tokens -> (17441 - 1) // 32 = 545 windows
    windows = Counter(tuple(stream[k * 32: k * 32 + 32]) for k in range(545))
    batches = run.evals["text"]
    assert len(batches) == samples // 4 and len(run.evals["docs"]) == samples // 4
    got = Counter(tuple(row) for x, y in batches for row in x.tolist())
    assert sum(got.values()) == samples and not got - windows  # no window more often than in the file
    assert all(torch.equal(x[:, 1:], y[:, :-1]) for x, y in batches)


def test_eval_batches_are_split_over_dp_ranks(world_of_one, tmp_path):
    cfg = DataConfig(corpus=str(JSONL), split="80,20,0", eval_samples=12, eval={"t": str(FIXTURES / "tiny_corpus.txt")})
    whole = build(cfg, tmp_path / "c", micro=4)
    halves = [build(cfg, tmp_path / "c", micro=2, dp_rank=r, dp_size=2) for r in range(2)]
    for k in range(3):
        assert torch.equal(whole.evals["t"][k][0], torch.cat([h.evals["t"][k][0] for h in halves]))
    for k in range(len(whole.valid)):
        assert torch.equal(whole.valid[k][0], torch.cat([h.valid[k][0] for h in halves]))


@pytest.mark.parametrize("micro,dp", [(2, 1), (1, 4), (3, 2)])
def test_evaluations_see_the_same_samples_whatever_the_batch_layout(world_of_one, tmp_path, micro, dp):
    """Before, the validation set was a number of batches: micro 4 and micro 2 x accum 2 measured on other samples."""
    cfg = DataConfig(corpus=str(JSONL), split="80,20,0", eval_samples=24, eval={"t": str(FIXTURES / "tiny_corpus.txt")})

    def samples(run_data):
        return {name: torch.cat([x for x, _ in batches]) for name, batches in
                [("valid", run_data.valid), ("t", run_data.evals["t"])]}

    whole = samples(build(cfg, tmp_path / "c", micro=4))
    shares = [samples(build(cfg, tmp_path / "c", micro=micro, dp_rank=r, dp_size=dp)) for r in range(dp)]
    for name, want in whole.items():
        got = torch.cat([s[name] for s in shares])
        assert len(got) == len(want) == 24
        assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, want.tolist()))


def test_unigram_entropy_is_of_the_training_distribution(world_of_one, tmp_path):
    run = build(DataConfig(corpus=str(JSONL), split="80,20,0"), tmp_path)
    tokens = run.train.samples.batch(range(len(run.train.samples)))[0].numpy().ravel()
    counts = numpy.bincount(tokens)
    p = counts[counts > 0] / counts.sum()
    # the first 1024 samples cover all of them here (the dataset was built for 400)
    assert run.unigram_entropy == pytest.approx(float(-(p * numpy.log(p)).sum()), rel=1e-12)


def test_building_without_a_process_group_does_not_hang(tmp_path):
    """A fresh interpreter, no torch.distributed: the path `prores preprocess` users and notebooks take."""
    code = ("import sys, torch.distributed as d; from pathlib import Path; from prores.config import DataConfig;"
            " from prores.data.sources import build_run_data; from prores.data.tokenizers import ByteTokenizer;"
            f" r = build_run_data(DataConfig(corpus={str(JSONL)!r}, split='80,20,0'), ByteTokenizer(), seq_length=32,"
            " micro_batch_size=4, train_samples=400, seed=7, cache_dir=Path(sys.argv[1]));"
            " print(d.is_initialized(), len(r.train.samples), len(r.valid))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    initialized, samples, valid = proc.stdout.split()[-3:]
    assert initialized == "False" and int(samples) >= 400 and int(valid) >= 1
