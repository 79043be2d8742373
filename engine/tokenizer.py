"""Text <-> token ids: the checkpoint's tokenizer.json through `tokenizers`, or a byte-level one for presets.

Presets have random weights and no vocabulary; ByteTokenizer maps UTF-8 bytes to ids BYTE_OFFSET..BYTE_OFFSET+255
(wrapped into the vocabulary when it is smaller), so a preset takes text and prints something (random text:
the weights are random). Ids outside the byte range decode to the byte (id - BYTE_OFFSET) mod 256, so any id
stream decodes. A checkpoint directory without tokenizer.json gets MissingTokenizer: token ids still run, a
text prompt is a clear error (bytes fed to a real model's vocabulary would print garbage without a word).
"""
from __future__ import annotations

import os
from pathlib import Path

from kog.engine.config import ConfigError, ModelConfig, check_checkpoint_file

BYTE_OFFSET = 3          # ids 0..2 stay free for pad/bos/eos, as byte-level vocabularies usually have them


def check_token_ids(ids, vocab_size: int, what: str = "prompt") -> list[int]:
    """`ids` as a list of ints, or ConfigError naming the first id outside [0, vocab_size) (an embedding
    lookup of -1 silently reads the last row; one past the end reads other memory on the GPU)."""
    out = []
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int):
            try:
                import numbers
                ok = isinstance(t, numbers.Integral) or (hasattr(t, "dtype") and not t.is_floating_point())
            except Exception:
                ok = False
            if not ok:
                raise ConfigError(f"{what} token {i}: {t!r} is not an integer token id")
        t = int(t)
        if not 0 <= t < vocab_size:
            raise ConfigError(f"{what} token {i}: id {t} is outside the vocabulary [0, {vocab_size})")
        out.append(t)
    return out


def check_text(text: str, what: str = "--prompt") -> str:
    """`text` if it encodes as UTF-8; ConfigError naming the offending position otherwise (bytes from argv
    that are not UTF-8 arrive as lone surrogates, which no tokenizer can encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        byte = f" (byte 0x{ord(bad) - 0xDC00:02x})" if 0xDC80 <= ord(bad) <= 0xDCFF else ""
        raise ConfigError(f"{what} is not valid UTF-8 text: character {e.start}{byte}") from None
    return text


class ByteTokenizer:
    kind = "bytes"

    def __init__(self, cfg: ModelConfig):
        self.vocab_size = cfg.vocab_size
        self.bos = cfg.bos_token_id if cfg.bos_token_id is not None and cfg.bos_token_id < cfg.vocab_size else None
        self.offset = BYTE_OFFSET if cfg.vocab_size >= BYTE_OFFSET + 256 else 0

    def encode(self, text: str) -> list[int]:
        ids = [(b + self.offset) % self.vocab_size for b in text.encode("utf-8")]
        return ([self.bos] if self.bos is not None else []) + ids

    def decode(self, ids) -> str:
        return bytes(((int(i) - self.offset) % 256) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    kind = "tokenizer.json"

    def __init__(self, path: Path):
        from tokenizers import Tokenizer
        check_checkpoint_file(path, "tokenizer")
        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as e:
            raise ConfigError(f"cannot read tokenizer {path}: {e}") from None

    def encode(self, text: str) -> list[int]:
        # The post-processor in tokenizer.json adds BOS where the model expects one (Llama 3, SmolLM2).
        return list(self.tok.encode(text).ids)

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


class MissingTokenizer:
    """A checkpoint directory without tokenizer.json: no text in or out."""
    kind = "none"

    def __init__(self, ckpt: Path):
        self.ckpt = ckpt

    def _refuse(self, *_):
        raise ConfigError(f"checkpoint {self.ckpt} has no tokenizer.json: give token ids instead of text, or add "
                          f"the model's tokenizer.json to the directory")

    encode = decode = _refuse


def load_tokenizer(model_spec: str | os.PathLike, cfg: ModelConfig):
    """ByteTokenizer for a preset; for a checkpoint directory HFTokenizer over its tokenizer.json, or
    MissingTokenizer when it has none."""
    from kog.engine.config import PRESETS
    d = Path(str(model_spec))
    if str(model_spec) in PRESETS or not d.is_dir():
        return ByteTokenizer(cfg)
    p = d / "tokenizer.json"
    return HFTokenizer(p) if p.is_file() else MissingTokenizer(d)


class StreamDecoder:
    """Incremental decode for streaming: the text each new token adds, never splitting a multi-byte character.

    Decodes a window of the ids (from the token before the last emitted piece, so a tokenizer that renders a
    token differently at the start of a text still joins pieces right) and emits the new suffix once it does
    not end in U+FFFD (an incomplete UTF-8 sequence); the window keeps each step's cost independent of the
    length generated so far. flush() returns what is still held back at the end."""

    def __init__(self, tok):
        self.tok, self.ids = tok, []
        self.start = self.read = 0          # window [start, len(ids)); ids[start:read] were already emitted

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        before = self.tok.decode(self.ids[self.start:self.read])
        text = self.tok.decode(self.ids[self.start:])
        if text.endswith("\ufffd") or len(text) <= len(before):
            # an incomplete character, or nothing new yet (a token that only renders with what follows)
            return ""
        self.start, self.read = self.read, len(self.ids)
        return text[len(before):]

    def flush(self) -> str:
        """The held-back tail (an incomplete character decodes as U+FFFD)."""
        before = self.tok.decode(self.ids[self.start:self.read])
        text = self.tok.decode(self.ids[self.start:])
        self.start = self.read = len(self.ids)
        return text[len(before):]
