"""Text <-> token ids: the checkpoint's tokenizer.json through `tokenizers`, or a byte-level fallback.

Presets have random weights and no vocabulary; ByteTokenizer maps UTF-8 bytes to ids BYTE_OFFSET..BYTE_OFFSET+255
(wrapped into the vocabulary when it is smaller), so `kogtune generate` works on a preset and prints something.
Ids outside the byte range decode to the byte (id - BYTE_OFFSET) mod 256, so any id stream decodes.
"""
from __future__ import annotations

import os
from pathlib import Path

from kog.engine.config import ConfigError, ModelConfig

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
        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as e:
            raise ConfigError(f"cannot read tokenizer {path}: {e}") from None

    def encode(self, text: str) -> list[int]:
        # The post-processor in tokenizer.json adds BOS where the model expects one (Llama 3, SmolLM2).
        return list(self.tok.encode(text).ids)

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


def load_tokenizer(model_spec: str | os.PathLike, cfg: ModelConfig):
    """HFTokenizer when `model_spec` is a directory with tokenizer.json, else ByteTokenizer."""
    p = Path(str(model_spec)) / "tokenizer.json"
    if p.is_file():
        return HFTokenizer(p)
    return ByteTokenizer(cfg)


class StreamDecoder:
    """Incremental decode for streaming: text of each new token, holding back an incomplete UTF-8 tail."""

    def __init__(self, tok):
        self.tok, self.ids, self.emitted = tok, [], ""

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):          # a multi-byte character not complete yet
            return ""
        new = text[len(self.emitted):] if text.startswith(self.emitted) else text
        self.emitted = text
        return new
