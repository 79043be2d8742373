"""The systems kog is compared against, behind the one interface `kogtune bench` drives.

A system is built by factory(cfg, weights, device) and offers

    generate(prompt_ids, n) -> (tokens, seconds)

n new tokens, greedy, no early stop. The prompt except its last token is prefilled (untimed); then n decode
steps run, each feeding one token and producing the next, and `seconds` times exactly those n steps (from the
first step's launch to the n-th token being ready on the device; tokens are read back after the clock stops).
tok/s = n / seconds.

    torch-compile     the gpt-fast way (kog.tune.gptfast): fused qkv and gate/up weights, SDPA with grouped
                      heads over a static cache, argmax in the graph, torch.compile(mode="reduce-overhead",
                      fullgraph=True)
    hf-compile        transformers' documented fast path: model.generate with a static cache, which compiles the
                      forward itself (its CompileConfig: mode="reduce-overhead", here fullgraph=True)
    cuda-graph        the plain Reference's decode step captured once in a torch.cuda.CUDAGraph, replayed per token
    hf-transformers   transformers' own *ForCausalLM built from the same weights, model.generate as it comes
                      (greedy, its default cache, no compile); decode timed from the first new token to the last
    reference-eager   the plain-torch Reference, one decode_step per token, launched eagerly (not benched by
                      default: every other system beats it)
"""
from __future__ import annotations

import time

import torch

from kog.engine.config import ModelConfig
from kog.engine.reference import Reference
from kog.engine.weights import Weights, hf_config_dict, to_hf_state_dict


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _round_up(x: int, m: int = 64) -> int:
    return (x + m - 1) // m * m


class ReferenceEager:
    """The Reference's decode_step in a Python loop, tokens kept on the device (no per-token host sync)."""

    name = "reference-eager"

    def __init__(self, cfg: ModelConfig, weights: Weights, device):
        self.cfg, self.w, self.device = cfg, weights, torch.device(device)
        self.ref: Reference | None = None

    def _reference(self, need: int) -> Reference:
        # One cache size per bench (rounded so repeats reuse it; a compiled/captured step depends on it).
        if self.ref is None or self.ref.max_seq < need:
            self.ref = Reference(self.cfg, self.w, _round_up(need))
            self._built(self.ref)
        return self.ref

    def _built(self, ref: Reference) -> None:
        """Hook: compile or capture the step for a new Reference."""

    def _prefill(self, prompt: list[int], n: int):
        if not prompt:
            raise ValueError("the prompt needs at least one token")
        ref = self._reference(len(prompt) + n)
        ref.reset()
        if len(prompt) > 1:
            ref.prefill(prompt[:-1])
        tok = torch.tensor([prompt[-1]], dtype=torch.long, device=self.device)
        pos = torch.tensor([len(prompt) - 1], dtype=torch.long, device=self.device)
        return ref, tok, pos

    def _next(self, ref: Reference, tok, pos):
        """One decode step: the greedy next token as a [1] tensor, left on the device."""
        return torch.argmax(ref.decode_step(tok, pos)).view(1)

    @torch.no_grad()
    def generate(self, prompt_ids, n: int):
        ref, tok, pos = self._prefill(list(prompt_ids), n)
        out = torch.empty(n, dtype=torch.long, device=self.device)
        _sync(self.device)
        t0 = time.perf_counter()
        for j in range(n):
            nxt = self._next(ref, tok, pos)
            out[j:j + 1].copy_(nxt)
            tok.copy_(nxt)
            pos.add_(1)
        _sync(self.device)
        return out.tolist(), time.perf_counter() - t0


class CudaGraph(ReferenceEager):
    """One decode step (forward, argmax, token/position update, token store) captured as a CUDA graph."""

    name = "cuda-graph"

    def __init__(self, cfg, weights, device):
        super().__init__(cfg, weights, device)
        if self.device.type != "cuda":
            raise RuntimeError("cuda-graph needs a CUDA device")

    def _built(self, ref: Reference) -> None:
        dev = self.device
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.out = torch.zeros(ref.max_seq + 1, dtype=torch.long, device=dev)   # out[p]: token after position p

        def step():
            nxt = torch.argmax(ref.decode_step(self.tok, self.pos)).view(1)
            self.out.index_copy_(0, self.pos, nxt)
            self.tok.copy_(nxt)
            self.pos.add_(1)

        with torch.no_grad():
            s = torch.cuda.Stream(dev)
            s.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(s):          # warm up on a side stream before capture, as PyTorch advises
                for _ in range(3):
                    self.pos.zero_()
                    step()
            torch.cuda.current_stream(dev).wait_stream(s)
            self.pos.zero_()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                step()
        ref.reset()

    @torch.no_grad()
    def generate(self, prompt_ids, n: int):
        prompt = list(prompt_ids)
        ref, tok, pos = self._prefill(prompt, n)
        self.tok.copy_(tok)
        self.pos.copy_(pos)
        _sync(self.device)
        t0 = time.perf_counter()
        for _ in range(n):
            self.graph.replay()
        _sync(self.device)
        dt = time.perf_counter() - t0
        p0 = len(prompt) - 1
        return self.out[p0:p0 + n].tolist(), dt


class TorchCompile:
    """gpt-fast: the fused decode step (kog.tune.gptfast.FusedDecoder: forward + argmax) under
    torch.compile(mode="reduce-overhead", fullgraph=True), the KV cache sized for the run; tokens stay on the
    device, the loop is a plain Python loop over compiled steps (CUDA graph replays)."""

    name = "torch-compile"
    warmup_steps = 4

    def __init__(self, cfg: ModelConfig, weights: Weights, device):
        self.cfg, self.w, self.device = cfg, weights, torch.device(device)
        self.model = None

    def _decoder(self, need: int):
        from kog.tune.gptfast import FusedDecoder
        if self.model is None or self.model.max_seq < need:
            self.model = FusedDecoder(self.cfg, self.w, _round_up(need))
            self.step = torch.compile(self.model.step, mode="reduce-overhead", fullgraph=True)
            tok = torch.zeros(1, dtype=torch.long, device=self.device)
            pos = torch.zeros(1, dtype=torch.long, device=self.device)
            t0 = time.perf_counter()
            with torch.no_grad():
                for _ in range(self.warmup_steps):   # compile, then let cudagraph trees record
                    tok.copy_(self.step(tok, pos))
                    pos.add_(1)
            _sync(self.device)
            self.compile_seconds = time.perf_counter() - t0
        return self.model

    @torch.no_grad()
    def generate(self, prompt_ids, n: int):
        prompt = list(prompt_ids)
        m = self._decoder(len(prompt) + n)
        m.reset()
        if len(prompt) > 1:                      # the prefill, eager and untimed
            m.forward(torch.tensor(prompt[:-1], device=self.device), torch.arange(len(prompt) - 1,
                                                                                    device=self.device))
        tok = torch.tensor([prompt[-1]], dtype=torch.long, device=self.device)
        pos = torch.tensor([len(prompt) - 1], dtype=torch.long, device=self.device)
        out = torch.empty(n, dtype=torch.long, device=self.device)
        _sync(self.device)
        t0 = time.perf_counter()
        for j in range(n):
            nxt = self.step(tok, pos)
            out[j:j + 1].copy_(nxt)               # out of the graph's output buffer before the next replay
            tok.copy_(nxt)
            pos.add_(1)
        _sync(self.device)
        return out.tolist(), time.perf_counter() - t0


def build_hf_model(cfg: ModelConfig, weights: Weights, device):
    """transformers' own model for cfg, holding a copy of `weights`."""
    import transformers
    d = hf_config_dict(cfg)
    d.pop("architectures")
    hf_cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    dt = weights.dtype
    old = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    finally:
        torch.set_default_dtype(old)
    sd = {k: v.to(device) for k, v in to_hf_state_dict(cfg, weights).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"HF model does not match the weights: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


class HFTransformers:
    """model.generate, greedy, with max/min_new_tokens fixed at n + 1 (the first new token comes from the prefill,
    then n decode steps are timed by a streamer that stamps each token as it arrives)."""

    name = "hf-transformers"

    def __init__(self, cfg: ModelConfig, weights: Weights, device):
        self.cfg, self.device = cfg, torch.device(device)
        self.model = build_hf_model(cfg, weights, self.device)
        self.cache_implementation: str | None = None
        self.generate_kw: dict = {"disable_compile": True} if _hf_knows("disable_compile") else {}
        self.note = ""

    def _run(self, prompt: list[int], n: int):
        from transformers.generation.streamers import BaseStreamer
        dev = self.device

        class Stamps(BaseStreamer):
            def __init__(self):
                self.t: list[float] = []

            def put(self, value):           # first call: the prompt; then one call per new token
                _sync(dev)
                self.t.append(time.perf_counter())

            def end(self):
                pass

        st = Stamps()
        ids = torch.tensor([prompt], dtype=torch.long, device=dev)
        kw = dict(max_new_tokens=n + 1, min_new_tokens=n + 1, do_sample=False, streamer=st,
                  attention_mask=torch.ones_like(ids), pad_token_id=0, temperature=None, top_p=None, top_k=None)
        if self.cache_implementation:
            kw["cache_implementation"] = self.cache_implementation
        kw.update(self.generate_kw)
        with torch.no_grad():
            out = self.model.generate(ids, **kw)
        toks = out[0, len(prompt):].tolist()
        return toks[:n], st.t[-1] - st.t[1]

    def generate(self, prompt_ids, n: int):
        prompt = list(prompt_ids)
        if self.cache_implementation:
            try:
                return self._run(prompt, n)
            except Exception as e:  # an older/newer transformers without a static cache for this model
                self.note = f"static cache failed ({type(e).__name__}: {str(e)[:200]}); dynamic cache used"
                self.cache_implementation = None
        return self._run(prompt, n)


def _hf_knows(field: str) -> bool:
    """Whether this transformers' GenerationConfig has `field`."""
    from transformers import GenerationConfig
    return hasattr(GenerationConfig(), field)


class HFCompile(HFTransformers):
    """transformers' documented fast path: model.generate with a static cache, on which generate compiles the
    model's forward itself (mode="reduce-overhead": CUDA graphs; fullgraph=True here). A forward wrapped in
    torch.compile by hand on top of that fights generate's own compile (CUDA graph outputs overwritten). The
    first generate of a cache size compiles (the bench's warm-up)."""

    name = "hf-compile"

    def __init__(self, cfg: ModelConfig, weights: Weights, device):
        super().__init__(cfg, weights, device)
        self.cache_implementation = "static"
        self.generate_kw = {}
        if _hf_knows("compile_config"):
            from transformers import CompileConfig
            self.generate_kw["compile_config"] = CompileConfig(fullgraph=True, mode="reduce-overhead")

    def generate(self, prompt_ids, n: int):
        return self._run(list(prompt_ids), n)


BASELINES = {
    "torch-compile": TorchCompile,
    "hf-compile": HFCompile,
    "cuda-graph": CudaGraph,
    "hf-transformers": HFTransformers,
    "reference-eager": ReferenceEager,
}
