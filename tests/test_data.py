"""Tokenizers, raw sources, and the resumable, dp-invariant sample order."""

from pathlib import Path

import pytest
import torch

from prores.data.batches import TrainBatches, fixed_batches, unigram_entropy
from prores.data.corpus import corpus_files, shakespeare_files
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
    assert any("To be, or not to be" in f.read_text() for f in files)
    assert corpus_files("shakespeare") == files


def test_raw_sources_are_existing_files(tmp_path):
    assert corpus_files(str(FIXTURES / "tiny_corpus.txt")) == [FIXTURES / "tiny_corpus.txt"]
    with pytest.raises(UsageError, match="'.*missing.txt': no such file; use 'shakespeare', a .txt, .md"):
        corpus_files(str(tmp_path / "missing.txt"))


class Windows:
    """Sample i = tokens [i*seq, (i+1)*seq] of a range: what IndexedSamples gives, in a known order."""

    def __init__(self, count, seq=4):
        self.count, self.seq = count, seq

    def __len__(self):
        return self.count

    def batch(self, indices):
        w = torch.stack([torch.arange(i * self.seq, (i + 1) * self.seq + 1) for i in indices])
        return w[:, :-1], w[:, 1:]


def test_unigram_entropy_by_hand():
    class Fixed:
        def __len__(self):
            return 2

        def batch(self, indices):
            return torch.tensor([[0, 0], [1, 2]])[list(indices)], None

    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert unigram_entropy(Fixed()) == pytest.approx(float(-(p * p.log()).sum()))
    assert unigram_entropy(Fixed(), max_samples=1) == 0.0  # only [0, 0]


def _global_stream(dp_size, steps, micro=2):
    """Concatenate every rank's micro-batches per step, in rank order."""
    ranks = [TrainBatches(Windows(49), micro, seed=5, dp_rank=r, dp_size=dp_size) for r in range(dp_size)]
    return torch.cat([torch.cat([next(it)[0] for it in ranks]) for _ in range(steps)])


def test_sample_i_of_the_run_is_sample_i_of_the_data_whatever_dp():
    one = _global_stream(dp_size=1, steps=30, micro=4)
    two = _global_stream(dp_size=2, steps=30, micro=2)
    assert torch.equal(one, two)
    # 120 samples of 49: the dataset's own order, wrapping around past its end
    assert one[:, 0].tolist() == [4 * (i % 49) for i in range(120)]


def test_state_dict_resumes_exactly():
    a = TrainBatches(Windows(50), 3, seed=9)
    straight = [next(a)[0] for _ in range(20)]
    b = TrainBatches(Windows(50), 3, seed=9)
    first = [next(b)[0] for _ in range(7)]
    c = TrainBatches(Windows(50), 3, seed=9)
    c.load_state_dict(b.state_dict())
    rest = [next(c)[0] for _ in range(13)]
    assert all(torch.equal(x, y) for x, y in zip(straight, first + rest))
    with pytest.raises(ValueError, match="seed 9, this run uses 10"):
        TrainBatches(Windows(50), 3, seed=10).load_state_dict(b.state_dict())


def test_fixed_batches_are_the_first_samples_and_sharded():
    whole = fixed_batches(Windows(25), 4, num_samples=12)
    halves = [fixed_batches(Windows(25), 2, num_samples=12, dp_rank=r, dp_size=2) for r in range(2)]
    for k in range(3):
        assert torch.equal(whole[k][0], torch.cat([halves[0][k][0], halves[1][k][0]]))
    assert len(whole) == 3 and whole[0][0][0, 0] == 0 and whole[2][0][-1, 0] == 44
    with pytest.raises(UsageError, match="data.eval.x has 9 sequences, fewer than data.eval_samples=12"):
        fixed_batches(Windows(9), 4, num_samples=12, what="data.eval.x")
    with pytest.raises(UsageError, match="data.eval_samples=12 is not a multiple of the evaluation batch of 8"):
        fixed_batches(Windows(25), 4, num_samples=12, dp_size=2)
