"""`kogtune generate`: text in, text out, tokens streamed as the kernel produces them; a thin layer over kog.Engine.

--mode targeted|grid runs the monokernel with the tuned config for this GPU and model
(kog.tune.store.tuned_config), --mode reference the plain-torch Reference; both take the same sampling
options (temperature, top-k, top-p, seed; kog.engine.reference states the rules) and stops (--stop strings,
--stop-id ids, beside the checkpoint's EOS ids).
"""
from __future__ import annotations

import json
import sys

from kog.errors import UsageError


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
    if args.seed is not None and not 0 <= args.seed < SEED_LIMIT:
        raise UsageError(f"--seed must be in [0, 2**63), got {args.seed}")
    try:
        check_text(args.prompt)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def _device(mode: str):
    """The GPU for the monokernel modes (the CPU where kernels run in Triton's interpreter); for the
    reference, the GPU when there is one."""
    import torch
    if mode == "reference":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from kog.engine.kernel.vendor import INTERPRET, vendor_code
    if vendor_code() == INTERPRET:
        return torch.device("cpu")
    from kog.tune.bench import available_systems
    why = getattr(available_systems().get(f"kog-{mode}"), "not_built_reason", None)
    if why:                                  # say what is missing before asking for a GPU
        from kog.errors import NotBuiltError
        raise NotBuiltError(f"--mode {mode}: the monokernel is {why}")
    from kog.probe.device import require_gpu
    require_gpu()
    return torch.device("cuda")


def cli_generate(args) -> int:
    _validate(args)
    from kog.engine.api import Engine
    from kog.tune.store import tuned_config

    device = _device(args.mode)
    engine = Engine.from_pretrained(args.model, device=device, mode=args.mode, max_seq=args.max_seq,
                                    config=lambda model, span: tuned_config(model, device, span))
    stop = [*args.stop, *args.stop_id]
    samp = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    pieces = engine.stream(args.prompt, args.tokens, stop=stop, **samp)
    if args.json:
        for _ in pieces:
            pass
    else:
        sys.stdout.write(args.prompt)
        for piece in pieces:
            sys.stdout.write(piece.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
    r = engine.last_result
    if args.json:
        print(json.dumps({"model": engine.cfg.name, "mode": args.mode, "prompt": args.prompt,
                          "prompt_ids": r.prompt_ids, "tokens": r.token_ids, "text": r.text, "seconds": r.seconds,
                          "tok_per_s": r.tok_per_s, "ttft_s": r.ttft_s, "compile_seconds": r.compile_seconds,
                          "stop_reason": r.stop_reason, "device": str(device),
                          "tokenizer": engine.tokenizer.kind, **dict(samp, seed=r.seed)}))
    else:
        compiled = f", compile {r.compile_seconds:.1f} s" if r.compile_seconds else ""
        noise = " (random weights: the text is noise)" if engine.random_weights else ""
        print(f"[{len(r.token_ids)} tokens, {r.tok_per_s:.1f} tok/s, first token {r.ttft_s * 1e3:.0f} ms{compiled}, "
              f"stop {r.stop_reason}, seed {r.seed}, mode {args.mode}, {engine.cfg.name}{noise}, "
              f"tokenizer {engine.tokenizer.kind}]",
              file=sys.stderr)
    return 0
