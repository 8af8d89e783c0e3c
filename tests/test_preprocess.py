"""`prores preprocess`: jsonl / text -> Megatron .bin/.idx, read back with Megatron's IndexedDataset."""

import json
from pathlib import Path

import numpy
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from conftest import run_cli
from prores.data import preprocess as pp
from prores.data.tokenizers import ByteTokenizer
from prores.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures"
EOD = ByteTokenizer.eod


def expected_ids(text):
    return list(text.encode("utf-8")) + [EOD]


def test_round_trip_exact_ids(tmp_path):
    docs = [json.loads(line)["text"] for line in (FIXTURES / "tiny_corpus.jsonl").read_text().splitlines()]
    report = pp.preprocess([str(FIXTURES / "tiny_corpus.jsonl")], str(tmp_path / "out"), progress=False)
    ds = IndexedDataset(str(tmp_path / "out"))
    assert report.documents == len(ds) == len(docs) == 12
    assert ds.document_indices.tolist() == list(range(13))
    for i, text in enumerate(docs):
        assert ds[i].tolist() == expected_ids(text)
    assert ds[0].dtype == numpy.uint16  # vocab 258 fits in 16 bits
    assert report.tokens == sum(len(expected_ids(t)) for t in docs)


def test_output_does_not_depend_on_workers(tmp_path):
    inputs = [str(FIXTURES / "tiny_corpus.jsonl"), str(FIXTURES / "tiny_corpus.txt")]
    pp.preprocess(inputs, str(tmp_path / "one"), workers=1, progress=False)
    pp.preprocess(inputs, str(tmp_path / "two"), workers=2, progress=False)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"one{ext}").read_bytes() == (tmp_path / f"two{ext}").read_bytes()


def test_large_text_streams_in_chunks_as_one_document(tmp_path, monkeypatch):
    monkeypatch.setattr(pp, "TEXT_CHUNK_BYTES", 1000)
    text = (FIXTURES / "tiny_corpus.txt").read_text()
    report = pp.preprocess([str(FIXTURES / "tiny_corpus.txt")], str(tmp_path / "t"), progress=False)
    ds = IndexedDataset(str(tmp_path / "t"))
    assert report.documents == 1 and report.items == len(ds) > 10
    assert ds.document_indices.tolist() == [0, len(ds)]
    assert numpy.concatenate([ds[i] for i in range(len(ds))]).tolist() == expected_ids(text)


def _bad_jsonl(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok one"}\n{"body": "no text key"}\nnot json at all\n\n{"text": 5}\n{"text": "ok two"}\n')
    return path


def test_bad_lines_are_reported_with_line_numbers_and_skipped(tmp_path, capsys):
    report = pp.preprocess([str(_bad_jsonl(tmp_path))], str(tmp_path / "out"), progress=False)
    assert [b.split(": ")[0] for b in report.bad_lines] == [f"{tmp_path}/bad.jsonl:{n}" for n in (2, 3, 5)]
    err = capsys.readouterr().err
    assert "bad.jsonl:2: KeyError" in err and "bad.jsonl:3: JSONDecodeError" in err and "bad.jsonl:5: TypeError" in err
    ds = IndexedDataset(str(tmp_path / "out"))
    assert [ds[i].tolist() for i in range(len(ds))] == [expected_ids("ok one"), expected_ids("ok two")]


def test_bad_line_can_be_fatal_and_leaves_no_output(tmp_path):
    with pytest.raises(UsageError, match=r"bad jsonl line .*bad.jsonl:2: KeyError"):
        pp.preprocess([str(_bad_jsonl(tmp_path))], str(tmp_path / "out"), on_bad_line="fail", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_missing_input_is_a_clear_error(tmp_path):
    with pytest.raises(UsageError, match="input file\\(s\\) not found: .*nope.jsonl"):
        pp.preprocess([str(tmp_path / "nope.jsonl")], str(tmp_path / "out"), progress=False)


def test_cli(tmp_path):
    ok = run_cli("preprocess", str(FIXTURES / "tiny_corpus.jsonl"), "--output-prefix", str(tmp_path / "c"),
                 "--workers", "2", timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "12 documents" in ok.stdout and "docs/s" in ok.stdout and "MB/s" in ok.stdout
    assert len(IndexedDataset(str(tmp_path / "c"))) == 12
    bad = run_cli("preprocess", str(_bad_jsonl(tmp_path)), "--output-prefix", str(tmp_path / "b"),
                  "--on-bad-line", "fail", timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "prores: error: bad jsonl line" in bad.stderr and "bad.jsonl:2" in bad.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_empty_documents_are_skipped_and_counted(tmp_path, capsys, workers):
    """Real corpora hold empty documents: an empty jsonl text and an empty text file are skipped."""
    jsonl = tmp_path / "some-empty.jsonl"
    jsonl.write_text('{"text": "first"}\n{"text": ""}\n{"text": "third"}\n')
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "one.txt").write_text("a text file\n")
    report = pp.preprocess([str(jsonl), str(tmp_path / "empty.txt"), str(tmp_path / "one.txt")],
                           str(tmp_path / "out"), workers=workers, progress=False)
    assert (report.documents, report.empty) == (3, 2)
    ds = IndexedDataset(str(tmp_path / "out"))
    assert [ds[i].tolist() for i in range(len(ds))] == [expected_ids(t) for t in ("first", "third", "a text file\n")]
    assert "3 documents, 25 tokens, 2 empty documents and 0 bad lines skipped" in capsys.readouterr().out


def test_a_text_file_ending_on_a_chunk_boundary_keeps_its_end_of_document(tmp_path, monkeypatch):
    monkeypatch.setattr(pp, "TEXT_CHUNK_BYTES", 4)
    (tmp_path / "t.txt").write_text("abcd\n")  # one whole chunk, then an empty last piece
    report = pp.preprocess([str(tmp_path / "t.txt")], str(tmp_path / "out"), progress=False)
    ds = IndexedDataset(str(tmp_path / "out"))
    assert (report.documents, report.empty) == (1, 0)
    assert numpy.concatenate([ds[i] for i in range(len(ds))]).tolist() == expected_ids("abcd\n")


@pytest.mark.parametrize("contents", [{"empty.txt": ""}, {"empty.jsonl": '{"text": ""}\n\n'}])
def test_input_without_text_is_one_clear_error(tmp_path, contents):
    for name, text in contents.items():
        (tmp_path / name).write_text(text)
    proc = run_cli("preprocess", *[str(tmp_path / n) for n in contents], "--output-prefix", str(tmp_path / "o"),
                   timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"prores: error: no text in {tmp_path / next(iter(contents))}: 1 empty document(s)" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(contents)  # no output, no temporaries
