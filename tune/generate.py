"""`kogtune generate`: text in, text out, tokens streamed as they come.

--mode reference runs the plain-torch Reference (CPU or GPU) with torch sampling; --mode targeted|grid runs the
monokernel as the bench's system kog-targeted|kog-grid (kog.tune.bench's registry, kog.tune.systems).

Sampling (reference mode; the monokernel implements the same rules in-kernel): temperature <= 0 is greedy;
otherwise logits / temperature, then top-k (keep the k largest; 0 = off), then top-p (keep the smallest prefix
of the sorted distribution whose mass reaches p, always at least one token), then one draw from a
torch.Generator seeded with --seed, so the same seed gives the same tokens.
"""
from __future__ import annotations

import inspect
import json
import sys
import time

import torch

from kog.errors import NotBuiltError, UsageError


def sample_next(logits: torch.Tensor, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> int:
    """One token id from logits [V] under greedy / temperature / top-k / top-p rules (see module docstring)."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    lg = logits.float() / temperature
    if top_k and 0 < top_k < lg.numel():
        kth = torch.topk(lg, top_k).values[-1]
        lg = lg.masked_fill(lg < kth, float("-inf"))
    if top_p < 1.0:
        sorted_lg, idx = torch.sort(lg, descending=True)
        probs = torch.softmax(sorted_lg, -1)
        mass_before = torch.cumsum(probs, -1) - probs          # mass of the strictly better tokens
        drop = mass_before >= top_p
        drop[0] = False
        lg = lg.scatter(0, idx[drop], float("-inf"))
    probs = torch.softmax(lg, -1)
    return int(torch.multinomial(probs, 1, generator=generator))


SEED_LIMIT = 2 ** 63      # a seed is an int64 wherever it goes (torch.Generator, the kernel's argument)


def _validate(args) -> None:
    import math
    from kog.engine.config import ConfigError
    from kog.engine.tokenizer import check_text
    if args.tokens < 1:
        raise UsageError("--tokens must be >= 1")
    if args.top_k < 0:
        raise UsageError("--top-k must be >= 0")
    if not 0.0 < args.top_p <= 1.0:          # NaN fails this too
        raise UsageError(f"--top-p must be in (0, 1], got {args.top_p}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise UsageError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if not 0 <= args.seed < SEED_LIMIT:
        raise UsageError(f"--seed must be in [0, 2**63), got {args.seed}")
    try:
        check_text(args.prompt)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def generate_reference(cfg, weights, prompt_ids: list[int], n: int, temperature=0.0, top_k=0, top_p=1.0,
                       seed=0, stop_ids=(), on_token=None) -> tuple[list[int], float]:
    """Reference decode with torch sampling; returns (tokens, decode seconds). Stops after a stop id."""
    from kog.engine.reference import Reference
    ref = Reference(cfg, weights, len(prompt_ids) + n)
    gen = torch.Generator(device=weights.device)
    gen.manual_seed(int(seed))
    out: list[int] = []
    with torch.no_grad():
        logits = ref.prefill(prompt_ids)
        t0 = time.perf_counter()
        pos = len(prompt_ids)
        while True:
            tok = sample_next(logits, temperature, top_k, top_p, gen)
            out.append(tok)
            if on_token:
                on_token(tok)
            if len(out) >= n or tok in stop_ids:
                break
            logits = ref.decode_step(tok, pos)
            pos += 1
    return out, time.perf_counter() - t0


def _monokernel_system(mode: str, cfg, weights, device):
    from kog.tune.bench import available_systems
    name = f"kog-{mode}"
    factory = available_systems().get(name)
    if factory is None:
        raise NotBuiltError(f"--mode {mode}: the monokernel is not built")
    try:
        return factory(cfg, weights, device)
    except NotBuiltError as e:
        raise NotBuiltError(f"--mode {mode}: the monokernel is {e}") from None


def cli_generate(args) -> int:
    _validate(args)
    from kog.engine.tokenizer import StreamDecoder, load_tokenizer
    from kog.engine.weights import resolve_model

    if args.mode != "reference":
        from kog.tune.bench import available_systems
        why = getattr(available_systems().get(f"kog-{args.mode}"), "not_built_reason", None)
        if why:                                  # say what is missing before asking for a GPU
            raise NotBuiltError(f"--mode {args.mode}: the monokernel is {why}")
        from kog.probe.device import require_gpu
        require_gpu()
        device = torch.device("cuda")
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg, w = resolve_model(args.model, device, seed=0)   # weights fixed; --seed is for sampling
    tok = load_tokenizer(args.model, cfg)
    prompt_ids = tok.encode(args.prompt)
    if not prompt_ids:
        raise UsageError("--prompt encodes to no tokens")
    from kog.engine.tokenizer import check_token_ids
    check_token_ids(prompt_ids, cfg.vocab_size, f"tokenizer {tok.kind} does not fit the model: prompt")
    if len(prompt_ids) + args.tokens > cfg.max_position_embeddings:
        raise UsageError(f"prompt ({len(prompt_ids)} tokens) + --tokens {args.tokens} exceeds the model's "
                         f"max_position_embeddings {cfg.max_position_embeddings}")

    stream = StreamDecoder(tok)
    streaming = not args.json

    def on_token(t: int) -> None:
        if streaming:
            sys.stdout.write(stream.push(t))
            sys.stdout.flush()

    samp = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    if streaming:
        sys.stdout.write(args.prompt)
        sys.stdout.flush()
    if args.mode == "reference":
        tokens, secs = generate_reference(cfg, w, prompt_ids, args.tokens, stop_ids=cfg.eos_token_id,
                                          on_token=on_token, **samp)
    else:
        system = _monokernel_system(args.mode, cfg, w, device)
        params = inspect.signature(system.generate).parameters
        takes_all = any(p.kind == p.VAR_KEYWORD for p in params.values())
        wanted = dict(samp, stop_ids=cfg.eos_token_id, on_token=on_token)
        kw = {k: v for k, v in wanted.items() if takes_all or k in params}
        missing = [k for k in ("temperature", "top_k", "top_p") if k not in kw and samp[k] != {
            "temperature": 0.0, "top_k": 0, "top_p": 1.0}[k]]
        if missing:
            raise UsageError(f"--mode {args.mode}: this monokernel build does not take {', '.join(missing)}")
        tokens, secs = system.generate(prompt_ids, args.tokens, **kw)
        tokens = list(tokens)
        if "stop_ids" not in kw:          # the kernel stops at EOS itself; keep the first one as the end
            for i, t in enumerate(tokens):
                if t in cfg.eos_token_id:
                    tokens = tokens[:i + 1]
                    break
        if "on_token" not in kw:          # no streaming hook: print what came back
            for t in tokens:
                on_token(t)
    tokens = list(tokens)
    if streaming:
        sys.stdout.write("\n")
        rate = len(tokens) / secs if secs > 0 else float("inf")
        print(f"[{len(tokens)} tokens, {rate:.1f} tok/s, mode {args.mode}, {cfg.name}, {tok.kind}]", file=sys.stderr)
    else:
        print(json.dumps({"model": cfg.name, "mode": args.mode, "prompt": args.prompt, "prompt_ids": prompt_ids,
                          "tokens": tokens, "text": tok.decode(tokens), "seconds": secs,
                          "tok_per_s": len(tokens) / secs if secs > 0 else None, "device": str(device),
                          "tokenizer": tok.kind, **samp}))
    return 0
