"""kog.Engine: the decode engine as a user calls it.

    engine = kog.Engine.from_pretrained("llama-3.2-1b")          # a preset, a checkpoint directory or a cached Hub id
    print(engine.generate("The quick brown fox", max_new_tokens=64).text)
    for piece in engine.stream("Once upon a time", max_new_tokens=64, temperature=0.8, top_p=0.9):
        print(piece.text, end="", flush=True)

One Engine owns one backend built once: a Monokernel (mode "targeted" or "grid") whose KV cache holds
`max_seq` positions (default: the model's context, at most DEFAULT_MAX_SEQ), so any request that fits runs on
the same packed weights and compiled kernels, and a longer one is refused rather than rebuilding; or, in mode
"reference", the plain-torch Reference with the same cache and the same sampling rules on the host.

Text: the checkpoint's tokenizer.json; a preset (random weights) takes and prints bytes; a checkpoint without
tokenizer.json takes token ids only (kog.engine.tokenizer). Stops: the checkpoint's EOS ids and any stop ids
go to the kernel's stop table; stop strings are matched on the host and end the output. The text never
contains a stop (an EOS or stop id's text, a stop string and what followed it in the same token); token_ids
hold every token generated, the one that stopped it included.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch

from kog.engine.config import ConfigError, ModelConfig
from kog.engine.engine_config import EngineConfig

MODES = ("targeted", "grid", "reference")
DEFAULT_MAX_SEQ = 4096          # cache positions when max_seq is not given (and the model's context allows)
MAX_STOP_IDS = 8                # the kernel's stop table (EOS ids included)
SEED_RANGE = 1 << 31            # the kernel's seed is an int32


@dataclass
class Piece:
    """What one generated token adds to the text. text may be "" (a character not complete yet, text held
    back because it may begin a stop string); token_id is None only for a last piece that releases such
    held-back text when the generation ends."""
    text: str
    token_id: int | None


@dataclass
class GenerationResult:
    text: str | None                 # None: the checkpoint has no tokenizer.json (token_ids still hold the output)
    token_ids: list[int]             # every token generated, the one that stopped it included
    prompt_ids: list[int]
    seconds: float                   # the request: prefill, decode, detokenization
    tok_per_s: float                 # generated tokens over the decode's seconds
    ttft_s: float                    # request start -> first token (the prefill included)
    stop_reason: str                 # "length", "eos", "stop_id" or "stop_string"
    seed: int                        # the sampling seed used (drawn when none was given)
    compile_seconds: float | None = None    # the first launch's kernel compile (None: nothing compiled)
    stop: int | str | None = None    # the stop id or string that ended it


@dataclass
class _Request:
    prompt_ids: list[int]
    n: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop_ids: list[int]              # the checkpoint's EOS ids, then the caller's
    stop_strings: list[str] = field(default_factory=list)


class Engine:
    """A model loaded once with its tokenizer and backend (module docstring). Build it with from_pretrained,
    or from a config and weights already in memory."""

    def __init__(self, cfg: ModelConfig, weights, tokenizer, *, mode: str = "targeted",
                 config: EngineConfig | Callable[[ModelConfig, int], EngineConfig] | None = None,
                 max_seq: int | None = None, name: str | None = None):
        if mode not in MODES:
            raise ConfigError(f"mode {mode!r} not in {', '.join(MODES)}")
        self.cfg, self.tokenizer, self.mode = cfg, tokenizer, mode
        self.name = name or cfg.name
        self.max_seq = cache_positions(cfg, max_seq)
        self.device = weights.device
        self.last_result: GenerationResult | None = None
        self.random_weights = False      # from_pretrained sets it for a preset
        if mode == "reference":
            from kog.engine.reference import Reference
            self.config = None
            self.backend = Reference(cfg, weights, self.max_seq)
        else:
            from kog.engine.monokernel import Monokernel
            self.config = engine_config(cfg, config, mode, weights.device, self.max_seq)
            self.backend = Monokernel(cfg, weights, self.config, weights.device, max_seq=self.max_seq)

    @classmethod
    def from_pretrained(cls, path_or_preset, device=None, config=None, mode: str = "targeted",
                        max_seq: int | None = None, dtype=None) -> "Engine":
        """An Engine over a preset (seeded random weights, byte tokenizer), an HF checkpoint directory, or a Hub
        model id already in the local Hugging Face cache (never downloaded).

        device: default the GPU when there is one, else the CPU (the monokernel then needs TRITON_INTERPRET=1).
        config: an EngineConfig, a function (model config, cache span) -> EngineConfig, or None for the
        platform's default (kog.engine.monokernel.platform_default; `kogtune generate` passes the tuned one);
        its sync mode is replaced by `mode`. max_seq: KV cache positions (default min(context, 4096)).
        dtype: the weights' dtype (default the checkpoint's; bfloat16 for a float32 one)."""
        from kog.engine.tokenizer import load_tokenizer
        from kog.engine.weights import locate_model, resolve_model
        if mode not in MODES:
            raise ConfigError(f"mode {mode!r} not in {', '.join(MODES)}")
        where = locate_model(path_or_preset)
        dev = torch.device(device) if device is not None else default_device()
        cfg, weights = resolve_model(where, dev, seed=0, dtype=dtype)
        engine = cls(cfg, weights, load_tokenizer(where, cfg), mode=mode, config=config, max_seq=max_seq,
                     name=str(path_or_preset))
        engine.random_weights = isinstance(where, str)
        return engine

    # ---- what the engine holds ------------------------------------------------------------------------------
    @property
    def compile_seconds(self) -> float | None:
        """The first launch's kernel compile time (None before it, and where nothing compiles)."""
        return getattr(self.backend, "compile_seconds", None)

    def encode(self, prompt: str | Iterable[int]) -> list[int]:
        """Token ids of a text prompt (the checkpoint's tokenizer), or the given ids checked against the
        vocabulary."""
        if isinstance(prompt, str):
            ids = list(self.tokenizer.encode(prompt))
            if not ids:
                raise ConfigError("the prompt encodes to no tokens")
            check_ids(ids, self.cfg.vocab_size, f"tokenizer {self.tokenizer.kind} does not fit the model: prompt")
            return ids
        ids = [int(t) for t in prompt]
        if not ids:
            raise ConfigError("the prompt is empty")
        check_ids(ids, self.cfg.vocab_size, "prompt")
        return ids

    # ---- generation ------------------------------------------------------------------------------------------
    def generate(self, prompt: str | Iterable[int], max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 stop: int | str | Iterable[int | str] | None = None) -> GenerationResult:
        """Up to max_new_tokens tokens after the prompt (text or ids). temperature <= 0 is greedy; top_k 0
        and top_p 1 are off; seed None draws a fresh one (result.seed); stop: ids and/or strings."""
        for _ in self.stream(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop):
            pass
        assert self.last_result is not None
        return self.last_result

    def stream(self, prompt: str | Iterable[int], max_new_tokens: int = 64, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
               stop: int | str | Iterable[int | str] | None = None) -> Iterator[Piece]:
        """generate() as Pieces yielded while the kernel runs; the request is checked before this returns,
        and self.last_result holds the GenerationResult once the iterator is exhausted."""
        req = self._request(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop)
        return self._run(req)

    def _request(self, prompt, n, temperature, top_k, top_p, seed, stop) -> _Request:
        check_sampling(n, temperature, top_k, top_p)
        ids = self.encode(prompt)
        need = len(ids) + int(n) - 1      # positions the cache holds: the prompt, then all but the last token
        if need > self.max_seq:
            raise ConfigError(f"prompt ({len(ids)} tokens) + max_new_tokens {n} need {need} cache positions, more "
                              f"than this engine's max_seq {self.max_seq} (Engine.from_pretrained(..., max_seq=N))")
        stop_ids, stop_strings = split_stops(stop)
        check_ids(stop_ids, self.cfg.vocab_size, "stop")
        table = list(dict.fromkeys([*self.cfg.eos_token_id, *stop_ids]))
        if self.mode != "reference" and len(table) > MAX_STOP_IDS:
            raise ConfigError(f"{len(table)} stop ids (the checkpoint's EOS ids included): the kernel's stop table "
                              f"holds {MAX_STOP_IDS}")
        if stop_strings and self.tokenizer.kind == "none":
            self.tokenizer.encode("")     # the no-tokenizer error: a stop string needs text
        seed = random.SystemRandom().randrange(SEED_RANGE) if seed is None else int(seed)
        return _Request(ids, int(n), float(temperature), int(top_k), float(top_p), seed, table, stop_strings)

    def _token_ids(self, req: _Request) -> Iterator[int]:
        """The backend's token stream for one request (its stop table set first)."""
        samp = dict(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=req.seed)
        if self.mode == "reference":
            return self.backend.stream(req.prompt_ids, req.n, stop_ids=req.stop_ids, **samp)
        self.backend.set_stop_ids(req.stop_ids)
        return self.backend.stream(req.prompt_ids, req.n, **samp)

    def _run(self, req: _Request) -> Iterator[Piece]:
        from kog.engine.tokenizer import StreamDecoder
        has_text = self.tokenizer.kind != "none"
        decoder, stops = StreamDecoder(self.tokenizer), StopStrings(req.stop_strings)
        eos = set(self.cfg.eos_token_id)
        t0 = time.perf_counter()
        self.backend.last_stream = None
        ids: list[int] = []
        text: list[str] = []
        ttft, reason, hit = None, "length", None
        tokens = self._token_ids(req)
        try:
            for t in tokens:
                ttft = time.perf_counter() - t0 if ttft is None else ttft
                ids.append(int(t))
                if t in req.stop_ids:     # the backend stops after it: its text is not output
                    reason, hit = ("eos" if t in eos else "stop_id"), int(t)
                    continue
                piece = stops.push(decoder.push(t)) if has_text else ""
                text.append(piece)
                if stops.hit is not None:
                    reason, hit = "stop_string", stops.hit
                    yield Piece(piece, int(t))
                    break
                yield Piece(piece, int(t))
        finally:
            tokens.close()                # a stop string ends the output before the launch ends
        if has_text and reason != "stop_string":
            tail = stops.flush(decoder.flush())
            if tail:
                text.append(tail)
                yield Piece(tail, None)
        self.last_result = self._result(req, ids, "".join(text) if has_text else None, t0, ttft, reason, hit)

    def _result(self, req, ids, text, t0, ttft, reason, hit) -> GenerationResult:
        seconds = time.perf_counter() - t0
        ls = getattr(self.backend, "last_stream", None) or {}
        decode_s = ls.get("decode_s") or seconds     # a stream ended early by a stop string: the request's time
        return GenerationResult(text=text, token_ids=ids, prompt_ids=req.prompt_ids, seconds=seconds,
                                tok_per_s=len(ids) / decode_s if decode_s > 0 else float("inf"),
                                ttft_s=ttft if ttft is not None else seconds, stop_reason=reason, seed=req.seed,
                                compile_seconds=self.compile_seconds, stop=hit)


class StopStrings:
    """Host-side stop strings over streamed text: push() returns the text that is safe to show (held back
    while it could still be the start of a stop string, cut before a stop string once one appears; then
    .hit is that string); flush() releases what is held back when the stream ends without one."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.hit: str | None = None

    def push(self, text: str) -> str:
        if self.hit is not None:          # the output has ended
            return ""
        if not self.stops:
            return text
        buf = self.held + text
        found = [(buf.find(s), s) for s in self.stops if s in buf]
        if found:
            at, self.hit = min(found)
            self.held = ""
            return buf[:at]
        keep = max((k for s in self.stops for k in range(1, min(len(s), len(buf) + 1))
                    if buf.endswith(s[:k])), default=0)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self, text: str = "") -> str:
        out = self.push(text)
        if self.hit is None:
            out, self.held = out + self.held, ""
        return out


# ---- checks and defaults ----------------------------------------------------------------------------------------

def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cache_positions(cfg: ModelConfig, max_seq: int | None) -> int:
    """The KV cache's positions: max_seq, or the model's context up to DEFAULT_MAX_SEQ; never beyond the
    context the model was trained for."""
    ctx = int(cfg.max_position_embeddings)
    if max_seq is None:
        return min(ctx, DEFAULT_MAX_SEQ)
    if not 2 <= int(max_seq) <= ctx:
        raise ConfigError(f"max_seq {max_seq} must be in 2..{ctx} (the model's max_position_embeddings)")
    return int(max_seq)


def engine_config(cfg: ModelConfig, config, mode: str, device, max_seq: int) -> EngineConfig:
    """The monokernel's config: `config` (an EngineConfig, or a function of the model config and the cache
    span) or the platform's default for this cache, in sync mode `mode`."""
    span = cfg.attention_span(max_seq)
    if config is None:
        from kog.engine.monokernel import platform_default
        e = platform_default(cfg, device, span)
    elif callable(config) and not isinstance(config, EngineConfig):
        e = config(cfg, span)
    elif isinstance(config, dict):
        e = EngineConfig.from_dict(config)
    else:
        e = config
    if not isinstance(e, EngineConfig):
        raise ConfigError(f"config must be an EngineConfig (got {type(e).__name__})")
    return e.replace(mode=mode)


def check_sampling(n, temperature, top_k, top_p) -> None:
    if int(n) < 1:
        raise ConfigError(f"max_new_tokens must be >= 1 (got {n})")
    if not temperature >= 0:
        raise ConfigError(f"temperature must be >= 0 (got {temperature})")
    if int(top_k) < 0:
        raise ConfigError(f"top_k must be >= 0 (got {top_k})")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1] (got {top_p})")


def check_ids(ids: list[int], vocab_size: int, what: str) -> None:
    from kog.engine.tokenizer import check_token_ids
    check_token_ids(ids, vocab_size, what)

def split_stops(stop) -> tuple[list[int], list[str]]:
    """(stop ids, stop strings) of a stop argument: None, an id, a string, or an iterable of both."""
    if stop is None:
        return [], []
    items = [stop] if isinstance(stop, (str, int)) else list(stop)
    ids = [int(s) for s in items if isinstance(s, int) and not isinstance(s, bool)]
    strings = [s for s in items if isinstance(s, str)]
    if len(ids) + len(strings) != len(items):
        raise ConfigError("stop takes token ids (int) and strings")
    return ids, strings
