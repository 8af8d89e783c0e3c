"""Tokenizer, corpus, split, packing and the resumable, dp-invariant sample order."""

import json
from pathlib import Path

import pytest
import torch

from prores.data.batches import PackedSamples, Splits, TrainBatches, split_documents, valid_batches
from prores.data.corpus import load_documents, shakespeare_files
from prores.data.tokenizers import ByteTokenizer, load_tokenizer
from prores.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures"


def test_byte_tokenizer_round_trip_and_specials():
    tok = ByteTokenizer()
    ids = tok.encode("Hé!")
    assert ids.tolist() == [72, 195, 169, 33]
    assert tok.decode(ids.tolist() + [tok.eod]) == "Hé!"
    assert (tok.eod, tok.pad, tok.vocab_size) == (256, 257, 258)


def test_hf_tokenizer_from_local_file(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "to": 1, "be": 2, "or": 3, "not": 4, "[UNK]": 5}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert tok.eod == 0 and tok.vocab_size == 6
    assert tok.encode("to be or not to be").tolist() == [1, 2, 3, 4, 1, 2]


def test_missing_tokenizer_file_is_a_clear_error():
    with pytest.raises(UsageError, match="data.tokenizer='nope.json': not 'byte' and no such file"):
        load_tokenizer("nope.json")


def test_shakespeare_corpus_is_found_without_download():
    files = shakespeare_files()
    assert len(files) == 38 and all(f.suffix == ".md" for f in files)
    docs = load_documents("shakespeare")
    assert len(docs) == 38 and any("To be, or not to be" in d for d in docs)
    assert not any(line.endswith(" ") for d in docs[:3] for line in d.splitlines())


def test_jsonl_and_text_corpora(tmp_path):
    docs = load_documents(str(FIXTURES / "tiny_corpus.jsonl"))
    assert len(docs) == 12 and docs[3].startswith("Document 3.")
    assert load_documents(str(FIXTURES / "tiny_corpus.txt"))[0].startswith("To be, or not")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "ok"}) + "\n{not json\n")
    with pytest.raises(UsageError, match=r"bad.jsonl:2: bad jsonl line"):
        load_documents(str(bad))
    with pytest.raises(UsageError, match="no such file"):
        load_documents(str(tmp_path / "missing.txt"))


def test_split_takes_the_tail_of_every_document():
    tok = ByteTokenizer()
    splits = split_documents(["abcdefghij", "0123456789"], tok, valid_fraction=0.2)
    assert splits.train.tolist() == list(b"abcdefgh") + [256] + list(b"01234567") + [256]
    assert splits.valid.tolist() == list(b"ij") + [256] + list(b"89") + [256]


def test_unigram_entropy_by_hand():
    splits = Splits(train=torch.tensor([0, 0, 1, 2], dtype=torch.int32), valid=torch.zeros(0))
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert splits.unigram_entropy() == pytest.approx(float(-(p * p.log()).sum()))


def test_packing_shifts_labels_by_one():
    samples = PackedSamples(torch.arange(11, dtype=torch.int32), seq_length=5)
    assert len(samples) == 2
    x, y = samples.batch([1, 0])
    assert x.tolist() == [[5, 6, 7, 8, 9], [0, 1, 2, 3, 4]]
    assert y.tolist() == [[6, 7, 8, 9, 10], [1, 2, 3, 4, 5]]


def _global_stream(dp_size, steps, micro=2, accum=1):
    """Concatenate every rank's micro-batches per step, in rank order."""
    samples = PackedSamples(torch.arange(200, dtype=torch.int32), seq_length=4)
    ranks = [TrainBatches(samples, micro, seed=5, dp_rank=r, dp_size=dp_size) for r in range(dp_size)]
    out = []
    for _ in range(steps):
        for _ in range(accum):
            out.append(torch.cat([next(it)[0] for it in ranks]))
    return torch.cat(out)


def test_sample_order_is_seeded_and_independent_of_dp():
    one = _global_stream(dp_size=1, steps=30, micro=4)
    two = _global_stream(dp_size=2, steps=30, micro=2)
    assert torch.equal(one, two)
    # 30 steps × 4 samples = 120 > 49 windows: crosses two epoch boundaries, each a permutation
    starts = one[:, 0].tolist()
    assert sorted(starts[:49]) == [4 * i for i in range(49)]
    assert starts[:49] != sorted(starts[:49]) and starts[:49] != starts[49:98]


def test_state_dict_resumes_exactly():
    samples = PackedSamples(torch.arange(200, dtype=torch.int32), seq_length=4)
    a = TrainBatches(samples, 3, seed=9)
    straight = [next(a)[0] for _ in range(20)]
    b = TrainBatches(samples, 3, seed=9)
    first = [next(b)[0] for _ in range(7)]
    c = TrainBatches(samples, 3, seed=9)
    c.load_state_dict(b.state_dict())
    rest = [next(c)[0] for _ in range(13)]
    assert all(torch.equal(x, y) for x, y in zip(straight, first + rest))
    with pytest.raises(ValueError, match="seed 9, this run uses 10"):
        TrainBatches(samples, 3, seed=10).load_state_dict(b.state_dict())


def test_valid_batches_are_fixed_and_sharded():
    samples = PackedSamples(torch.arange(101, dtype=torch.int32), seq_length=4)  # 25 windows
    whole = valid_batches(samples, 4, num_batches=3)
    halves = [valid_batches(samples, 2, num_batches=3, dp_rank=r, dp_size=2) for r in range(2)]
    for k in range(3):
        assert torch.equal(whole[k][0], torch.cat([halves[0][k][0], halves[1][k][0]]))
    assert whole[0][0][0, 0] == 0 and whole[2][0][-1, 0] == 44
    with pytest.raises(UsageError, match="fewer than one batch of 32"):
        valid_batches(samples, 32, num_batches=1)
