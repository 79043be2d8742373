"""The reference equals Hugging Face transformers' own model on the same weights (tiny configs, float32, CPU).

Each case builds the HF model, randomises every parameter (norm weights and biases included, so a skipped
norm or bias shows), saves it with save_pretrained(safe_serialization=True), loads it with load_checkpoint, and
compares the logits of a prefill and of several decode steps against HF's forward over the same sequence.
"""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kog.engine.config import ConfigError  # noqa: E402
from kog.engine.reference import Reference, rope_cos_sin, rope_inv_freq  # noqa: E402
from kog.engine.weights import load_checkpoint, random_weights, save_checkpoint  # noqa: E402

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=64)
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}

CASES = {
    "llama-untied": ("LlamaConfig", "LlamaForCausalLM", dict(rope_theta=10000.0, tie_word_embeddings=False)),
    "llama3-scaled-tied": ("LlamaConfig", "LlamaForCausalLM",
                           dict(rope_theta=500000.0, rope_scaling=LLAMA3_SCALING, tie_word_embeddings=True)),
    "qwen2-bias-tied": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1e6, tie_word_embeddings=True)),
    "qwen3-qknorm": ("Qwen3Config", "Qwen3ForCausalLM", dict(rope_theta=1e6, tie_word_embeddings=False)),
    # a window shorter than the test sequence, so the sliding-window mask is exercised
    "mistral-window": ("MistralConfig", "MistralForCausalLM",
                       dict(rope_theta=1e6, tie_word_embeddings=False, sliding_window=5)),
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def _hf_model(case: str, seed: int = 0):
    cfg_cls, model_cls, extra = CASES[case]
    cfg = getattr(transformers, cfg_cls)(**TINY, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "bias" not in name:          # a norm weight
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    return model


@pytest.fixture(scope="module", params=list(CASES))
def hf_ckpt(request, tmp_path_factory):
    model = _hf_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d, safe_serialization=True)
    return request.param, model, d


def _hf_logits(model, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([seq]), use_cache=False).logits[0]


def test_matches_hf_prefill_and_decode(hf_ckpt):
    case, model, d = hf_ckpt
    cfg, w = load_checkpoint(d, "cpu", dtype=torch.float32)
    assert cfg.tie_word_embeddings == model.config.tie_word_embeddings
    assert w.tied == cfg.tie_word_embeddings
    if case == "qwen2-bias-tied":
        assert cfg.attention_bias and "layers.0.bqkv" in w
    if case == "qwen3-qknorm":
        assert cfg.qk_norm and "layers.1.k_norm" in w
    if case == "llama3-scaled-tied":
        assert cfg.rope_scaling and cfg.rope_scaling["rope_type"] == "llama3"
    if case == "mistral-window":
        assert cfg.sliding_window == 5

    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, TINY["vocab_size"], (14,), generator=g).tolist()
    P = 8
    want = _hf_logits(model, seq)

    ref = Reference(cfg, w, max_seq=32)
    every = ref.forward_tokens(seq[:P])
    assert _rel(every, want[:P]) < 1e-4
    ref.reset()
    last = ref.prefill(seq[:P])
    assert _rel(last, want[P - 1]) < 1e-4
    for j in range(P, len(seq)):                      # decode steps with tensor token/position
        got = ref.decode_step(torch.tensor([seq[j]]), torch.tensor([j]))
        assert got.shape == (TINY["vocab_size"],)
        assert _rel(got, want[j]) < 1e-4, f"{case}: decode step at position {j}"


def test_teacher_forced_and_greedy_agree_with_hf(hf_ckpt):
    case, model, d = hf_ckpt
    cfg, w = load_checkpoint(d, "cpu", dtype=torch.float32)
    ref = Reference(cfg, w, max_seq=32)
    prompt = [3, 17, 99, 4, 250]
    toks = ref.greedy(prompt, 6)
    with torch.no_grad():
        hf = model.generate(torch.tensor([prompt]), max_new_tokens=6, min_new_tokens=6, do_sample=False,
                            pad_token_id=0)[0, len(prompt):].tolist()
    assert toks == hf
    tf = Reference(cfg, w, max_seq=32).teacher_forced_logits(prompt, toks)
    want = _hf_logits(model, prompt + toks)[len(prompt) - 1:-1]
    assert tf.shape == (6, cfg.vocab_size)
    assert _rel(tf, want) < 1e-4


def test_llama3_inv_freq_matches_hf():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    hf_cfg = transformers.LlamaConfig(**TINY, rope_theta=500000.0, rope_scaling=LLAMA3_SCALING)
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    from kog.engine.config import ModelConfig
    cfg = ModelConfig.from_hf({**hf_cfg.to_dict(), "architectures": ["LlamaForCausalLM"]}).replace(dtype="float32")
    got = rope_inv_freq(cfg)
    assert torch.equal(got, want.float())
    plain = rope_inv_freq(cfg.replace(rope_scaling=None))
    assert not torch.equal(got, plain)            # the scaling changed the low frequencies
    cos, sin = rope_cos_sin(cfg, 10)
    assert cos.shape == (10, 16) and torch.equal(cos[:, :8], cos[:, 8:])


def test_round_trip_save_checkpoint_loads_in_hf(tmp_path):
    """Our save_checkpoint writes what HF reads: same logits from HF and from the reference."""
    from kog.engine.config import preset
    cfg = preset("tiny").replace(dtype="float32", tie_word_embeddings=False)
    w = random_weights(cfg, "cpu", seed=3)
    save_checkpoint(cfg, w, tmp_path / "ck", max_shard_bytes=200_000)     # sharded, with an index
    assert (tmp_path / "ck" / "model.safetensors.index.json").exists()
    cfg2, w2 = load_checkpoint(tmp_path / "ck", "cpu", dtype="float32")
    assert set(w2) == set(w) and all(torch.equal(w[k], w2[k]) for k in w)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ck", dtype=torch.float32).eval()
    seq = [1, 5, 9, 200, 300, 7]
    assert _rel(Reference(cfg2, w2, 16).forward_tokens(seq), _hf_logits(model, seq)) < 1e-4


def test_random_weights_give_spread_logits():
    from kog.engine.config import preset
    cfg = preset("tiny").replace(dtype="float32")
    w = random_weights(cfg, "cpu", seed=0)
    assert torch.equal(w["layers.0.wqkv"], random_weights(cfg, "cpu", seed=0)["layers.0.wqkv"])
    assert not torch.equal(w["layers.0.wqkv"], random_weights(cfg, "cpu", seed=1)["layers.0.wqkv"])
    logits = Reference(cfg, w, 32).forward_tokens(list(range(1, 17)))
    std = logits.std(-1)
    assert bool(((std > 0.5) & (std < 10)).all()), std          # neither flat nor one-hot
    toks = Reference(cfg, w, 64).greedy([1, 2, 3], 20)
    assert len(set(toks)) > 1                                  # greedy does not collapse to one token


# ---- corrupted checkpoints: one clear ConfigError naming the tensor or field --------------------------------

@pytest.fixture()
def good_ckpt(tmp_path):
    from kog.engine.config import preset
    cfg = preset("tiny").replace(dtype="bfloat16", tie_word_embeddings=False)
    d = save_checkpoint(cfg, random_weights(cfg, "cpu", seed=0), tmp_path / "good")
    return cfg, d


def _rewrite(d, fn):
    from safetensors.torch import load_file, save_file
    sd = load_file(str(d / "model.safetensors"))
    fn(sd)
    save_file(sd, str(d / "model.safetensors"))


def test_missing_tensor(good_ckpt):
    _, d = good_ckpt
    _rewrite(d, lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ConfigError, match=r"missing tensor model\.layers\.1\.mlp\.up_proj\.weight"):
        load_checkpoint(d)


def test_wrong_shape(good_ckpt):
    _, d = good_ckpt

    def f(sd):
        sd["model.layers.0.mlp.down_proj.weight"] = torch.zeros(64, 64, dtype=torch.bfloat16)
    _rewrite(d, f)
    with pytest.raises(ConfigError, match=r"tensor model\.layers\.0\.mlp\.down_proj\.weight: expected \[64, 128\], "
                                          r"got \[64, 64\]"):
        load_checkpoint(d)


def test_bad_tensor_dtype(good_ckpt):
    _, d = good_ckpt

    def f(sd):
        sd["model.norm.weight"] = torch.ones(64, dtype=torch.int8)
    _rewrite(d, f)
    with pytest.raises(ConfigError, match=r"tensor model\.norm\.weight: unsupported dtype I8"):
        load_checkpoint(d)


def test_bad_config_dtype(good_ckpt):
    _, d = good_ckpt
    c = json.loads((d / "config.json").read_text())
    c["torch_dtype"] = "float8_e4m3fn"
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError, match=r"torch_dtype.*float8_e4m3fn"):
        load_checkpoint(d)


def test_malformed_config_json(good_ckpt):
    _, d = good_ckpt
    (d / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"not valid JSON"):
        load_checkpoint(d)


def test_unknown_architecture(good_ckpt):
    _, d = good_ckpt
    c = json.loads((d / "config.json").read_text())
    c["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError, match=r"'architectures': GPT2LMHeadModel is not supported"):
        load_checkpoint(d)


def test_missing_config_field_and_corrupt_file(good_ckpt):
    _, d = good_ckpt
    (d / "model.safetensors").write_bytes(b"garbage, not safetensors")
    with pytest.raises(ConfigError, match=r"cannot read safetensors file"):
        load_checkpoint(d)
    c = json.loads((d / "config.json").read_text())
    del c["intermediate_size"]
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError, match=r"'intermediate_size' is missing"):
        load_checkpoint(d)


def test_not_a_directory_and_no_weights(tmp_path):
    with pytest.raises(ConfigError, match="not a directory"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 8,
                                                      "hidden_size": 8, "intermediate_size": 8,
                                                      "num_hidden_layers": 1, "num_attention_heads": 2}))
    with pytest.raises(ConfigError, match=r"no \*\.safetensors"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_float32_compute_over_bf16_weights(arch):
    """compute_dtype=float32 over bf16 weights is the model's float32 math on the checkpoint's values: the
    same logits as a Reference over the weights upcast (the bench's oracle, without a second copy of the
    model); cache_dtype=bf16 (the monokernel's prefill) stores the KV cache rounded and stays far closer to
    that oracle than the bf16 Reference does."""
    from kog.engine.config import PRESETS
    from kog.engine.weights import Weights
    extra = {"qwen2": dict(attention_bias=True), "qwen3": dict(qk_norm=True)}.get(arch, {})
    cfg = PRESETS["tiny"].replace(arch=arch, dtype="bfloat16", **extra)
    w = random_weights(cfg, "cpu", seed=5, dtype=torch.bfloat16)
    w32 = Weights({k: v.float() for k, v in w.items()})
    if w.tied:
        w32["lm_head"] = w32["embed"]
    prompt, forced = [3, 9, 27, 81, 243, 17, 5], [1, 2, 3, 4, 5, 6]
    want = Reference(cfg, w32, 32).teacher_forced_logits(prompt, forced)
    got = Reference(cfg, w, 32, compute_dtype=torch.float32).teacher_forced_logits(prompt, forced)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    r = Reference(cfg, w, 32, compute_dtype=torch.float32, cache_dtype=torch.bfloat16)
    assert r.cache.dtype == torch.bfloat16
    half = r.teacher_forced_logits(prompt, forced)
    bf16 = Reference(cfg, w, 32).teacher_forced_logits(prompt, forced).float()

    def err(a):
        return float((a - want).abs().max() / want.abs().max())
    assert 0 < err(half) < err(bf16) / 2, (err(half), err(bf16))
