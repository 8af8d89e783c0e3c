"""Tokenizers: byte-level by default, or a local Hugging Face ``tokenizer.json``."""

from __future__ import annotations

from prores.errors import UsageError

from pathlib import Path

import torch

EOD_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")


class ByteTokenizer:
    """UTF-8 bytes 0..255, then the special tokens <eod> = 256 and <pad> = 257."""

    name = "byte"
    eod = 256
    pad = 257
    vocab_size = 258

    def encode(self, text: str) -> torch.Tensor:
        data = bytearray(text.encode("utf-8"))
        if not data:  # torch.frombuffer refuses an empty buffer
            return torch.empty(0, dtype=torch.int32)
        return torch.frombuffer(data, dtype=torch.uint8).to(torch.int32)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A local ``tokenizer.json`` through the ``tokenizers`` library; never downloads."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        self.name = str(path)
        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        ids = [self._tok.token_to_id(t) for t in EOD_NAMES]
        found = [i for i in ids if i is not None]
        if not found:
            raise UsageError(
                f"{path}: no end-of-document token found (looked for {', '.join(EOD_NAMES)});"
                " add one of them to the tokenizer's added_tokens."
            )
        self.eod = found[0]

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor(self._tok.encode(text, add_special_tokens=False).ids, dtype=torch.int32)

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])


def load_tokenizer(spec: str):
    if spec == "byte":
        return ByteTokenizer()
    path = Path(spec)
    if not path.is_file():
        raise UsageError(f"data.tokenizer={spec!r}: not 'byte' and no such file; give a local tokenizer.json.")
    return HFTokenizer(path)
