"""Megatron indexed datasets as training samples: blends, determinism, dp invariance, bad paths."""

import json
from pathlib import Path

import pytest
import torch

from prores.data.batches import TrainBatches
from prores.data.indexed import IndexedSamples, build_gpt_datasets
from prores.data.preprocess import preprocess
from prores.data.tokenizers import ByteTokenizer
from prores.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    root = tmp_path_factory.mktemp("indexed")
    preprocess([str(FIXTURES / "tiny_corpus.jsonl")], str(root / "a"), progress=False)
    lines = (FIXTURES / "tiny_corpus.txt").read_text().splitlines()
    (root / "b.jsonl").write_text("".join(json.dumps({"text": l}) + "\n" for l in lines if l))
    preprocess([str(root / "b.jsonl")], str(root / "b"), progress=False)
    preprocess([str(FIXTURES / "tiny_corpus.txt")], str(root / "one_doc"), progress=False)
    return str(root / "a"), str(root / "b"), str(root / "one_doc")


def build(prefixes, tmp_path, weights=None, seed=1, num_train=2000):
    return build_gpt_datasets(prefixes, weights, ByteTokenizer(), seq_length=32, seed=seed,
                              cache_dir=tmp_path / "cache", num_train=num_train, num_valid=20)


def test_blend_follows_weights(world_of_one, prefixes, tmp_path):
    train, _ = build(prefixes[:2], tmp_path, weights=[0.7, 0.3])
    share = float((train.dataset_index[:2000] == 0).mean())  # Megatron's BlendedDataset bookkeeping
    assert share == pytest.approx(0.7, abs=0.01)


def test_samples_are_next_token_pairs_from_the_data(world_of_one, prefixes, tmp_path):
    train, valid = build(prefixes[:1], tmp_path)
    x, y = IndexedSamples(train).batch([0, 5])
    assert x.shape == y.shape == (2, 32)
    assert torch.equal(x[:, 1:], y[:, :-1])  # labels are inputs shifted by one
    text = (FIXTURES / "tiny_corpus.jsonl").read_text()
    assert all(0 <= int(t) <= 256 for t in x.flatten()) and len(valid) >= 20
    assert bytes(int(t) for t in x[0] if t < 256).decode("utf-8", "replace")[:8] in text


def test_same_seed_same_order_other_seed_other_order(world_of_one, prefixes, tmp_path):
    a = IndexedSamples(build(prefixes[:2], tmp_path / "1", weights=[0.5, 0.5])[0]).batch(range(50))[0]
    b = IndexedSamples(build(prefixes[:2], tmp_path / "2", weights=[0.5, 0.5])[0]).batch(range(50))[0]
    c = IndexedSamples(build(prefixes[:2], tmp_path / "3", weights=[0.5, 0.5], seed=2)[0]).batch(range(50))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_global_order_does_not_depend_on_dp(world_of_one, prefixes, tmp_path):
    samples = IndexedSamples(build(prefixes[:2], tmp_path, weights=[0.6, 0.4], num_train=200)[0])
    one = TrainBatches(samples, 4, seed=3)
    two = [TrainBatches(samples, 2, seed=3, dp_rank=r, dp_size=2) for r in range(2)]
    for _ in range(10):
        assert torch.equal(next(one)[0], torch.cat([next(it)[0] for it in two]))


def test_missing_index_is_a_clear_error(world_of_one, tmp_path):
    with pytest.raises(UsageError, match=r"nope.idx not found; create PREFIX.bin/.idx with `prores preprocess"):
        (tmp_path / "nope.bin").write_bytes(b"")
        build([str(tmp_path / "nope")], tmp_path)


def test_a_split_without_documents_is_an_error_not_a_hang(world_of_one, prefixes, tmp_path):
    with pytest.raises(UsageError, match=r"one_doc' has 1 sequence\(s\) \(a document each, .*: its valid split \(5%"):
        build([prefixes[2]], tmp_path)
