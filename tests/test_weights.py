"""Weights: canonical layout, seeded random weights, checkpoint round trips, resolve_model."""
from __future__ import annotations

import json

import pytest
import torch

from kog.engine.config import PRESETS, ConfigError, preset
from kog.engine.weights import (Weights, expected_shapes, load_checkpoint, random_weights, resolve_model,
                                save_checkpoint)


@pytest.mark.parametrize("arch_cfg", [
    dict(),                                                     # llama, tied
    dict(arch="qwen2", attention_bias=True, tie_word_embeddings=False),
    dict(arch="qwen3", qk_norm=True),
])
def test_random_weights_layout_and_seed(arch_cfg):
    cfg = preset("tiny").replace(**arch_cfg)
    w = random_weights(cfg, "cpu", seed=5)
    assert isinstance(w, Weights) and w.dtype == torch.bfloat16
    assert {k: tuple(v.shape) for k, v in w.items()} == expected_shapes(cfg)
    assert w.tied == cfg.tie_word_embeddings
    assert ("layers.1.bqkv" in w) == cfg.attention_bias and ("layers.0.q_norm" in w) == cfg.qk_norm
    again = random_weights(cfg, "cpu", seed=5)
    assert all(torch.equal(w[k], again[k]) for k in w)
    other = random_weights(cfg, "cpu", seed=6)
    assert not torch.equal(w["layers.0.w_down"], other["layers.0.w_down"])
    # realistic scale: matrices ~ 1/sqrt(K), norms around 1
    std = w["layers.0.w_down"].float().std().item()
    assert abs(std - cfg.intermediate_size ** -0.5) < 0.2 * cfg.intermediate_size ** -0.5
    assert abs(w["norm"].float().mean().item() - 1.0) < 0.1


def test_nbytes_counts_tied_once():
    cfg = preset("tiny")
    w = random_weights(cfg, "cpu")
    assert w.nbytes() == cfg.num_params() * 2


def test_checkpoint_round_trip_and_dtype(tmp_path):
    cfg = preset("tiny").replace(arch="qwen2", attention_bias=True, tie_word_embeddings=False, dtype="float32")
    w = random_weights(cfg, "cpu", seed=1)
    d = save_checkpoint(cfg, w, tmp_path / "ck")
    c2, w2 = load_checkpoint(d)                     # float32 checkpoint -> bfloat16 by default
    assert c2.dtype == "bfloat16" and w2.dtype == torch.bfloat16
    assert torch.equal(w2["layers.1.bqkv"], w["layers.1.bqkv"].bfloat16())
    c3, w3 = load_checkpoint(d, dtype=torch.float32)
    assert c3.dtype == "float32" and all(torch.equal(w[k], w3[k]) for k in w)
    assert c3.replace(name="x", dtype="bfloat16") == cfg.replace(name="x", dtype="bfloat16")
    with pytest.raises(ConfigError, match="unsupported dtype 'int8'"):
        load_checkpoint(d, dtype=torch.int8)


def test_tied_checkpoint_ignores_extra_lm_head_and_reads_generation_eos(tmp_path):
    from safetensors.torch import load_file, save_file
    cfg = preset("tiny")
    w = random_weights(cfg, "cpu", seed=2)
    d = save_checkpoint(cfg, w, tmp_path / "ck")
    sd = load_file(str(d / "model.safetensors"))
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()      # some tied checkpoints keep a copy
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(sd, str(d / "model.safetensors"))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    c2, w2 = load_checkpoint(d)
    assert w2.tied and c2.eos_token_id == (2, 7)


def test_resolve_model(tmp_path):
    cfg, w = resolve_model("tiny", "cpu", seed=0)
    assert cfg is PRESETS["tiny"] and torch.equal(w["embed"], random_weights(cfg, "cpu", 0)["embed"])
    save_checkpoint(cfg, w, tmp_path / "ck")
    c2, w2 = resolve_model(tmp_path / "ck")
    assert torch.equal(w2["layers.1.w_up"], w["layers.1.w_up"])
    with pytest.raises(ConfigError, match="llama-3.2-1b.*tiny"):
        resolve_model("gpt-17")
