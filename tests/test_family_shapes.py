"""The rule's config on Llama-family shapes no preset has: what a user's own checkpoint gets before any search.

Published shapes (vocabulary, hidden, intermediate, layers, heads, KV heads, head_dim) of models kog was never
tuned on: the sm_90 rule must give each a config that validates and whose plan passes the schedule checker on
an H200's and an H100's SM counts and compile for sm_90 (no GPU: Triton's ptxas) to a kernel whose grid fits
on the GPU's SMs at once; a head_dim the kernel cannot take is refused with one clear error."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kog.engine.config import ConfigError, ModelConfig
from kog.engine.engine_config import sm90_default
from kog.engine.plan import check_plan, make_plan
from test_regreport import _ptxas_runs

FAMILY = {  # arch, V, H, I, layers, heads, KV heads, head_dim
    "SmolLM2-135M": ("llama", 49152, 576, 1536, 30, 9, 3, 64),
    "SmolLM2-360M": ("llama", 49152, 960, 2560, 32, 15, 5, 64),
    "Qwen2.5-0.5B": ("qwen2", 151936, 896, 4864, 24, 14, 2, 64),
    "TinyLlama-1.1B": ("llama", 32000, 2048, 5632, 22, 32, 4, 64),
    "Qwen3-0.6B": ("qwen3", 151936, 1024, 3072, 28, 16, 8, 128),
    "deepseek-coder-1.3b": ("llama", 32256, 2048, 5504, 24, 16, 16, 128),
    "Qwen3-4B": ("qwen3", 151936, 2560, 9728, 36, 32, 8, 128),
    "Mistral-7B": ("mistral", 32768, 4096, 14336, 32, 32, 8, 128),
    "Llama-2-7b, padded vocabulary": ("llama", 32001, 4096, 11008, 32, 32, 32, 128),
    "Qwen2.5-7B": ("qwen2", 152064, 3584, 18944, 28, 28, 4, 128),
}


def _model(name: str) -> ModelConfig:
    arch, V, H, I, L, nh, nkv, hd = FAMILY[name]
    return ModelConfig(arch, V, H, I, L, nh, nkv, hd, attention_bias=arch == "qwen2", qk_norm=arch == "qwen3",
                       name=name).validate()


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_the_rule_plans_every_family_shape(name):
    m = _model(name)
    e = sm90_default(m)
    for sms in (132, 114):
        e.validate(m, sms=sms)
        check_plan(make_plan(m, e, sms), m, e)


@pytest.mark.skipif(not _ptxas_runs(), reason="the ptxas of the triton wheel cannot run here")
@pytest.mark.parametrize("name", sorted(FAMILY))
def test_the_rule_compiles_every_family_shape_for_sm90_and_fits(name, tmp_path):
    """The checkpoint path (config.json only) through the sm_90 build at the bench's 321 positions: the rule's
    config compiles, and the registers and shared memory it takes leave room for its CTAs per SM (a grid past
    the co-resident CTAs would wait forever on a CTA that never starts)."""
    from kog.engine.weights import hf_config_dict
    m = _model(name)
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(m)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "kog.engine.regreport", "--model", str(tmp_path), "--max-seq", "321",
                        "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["engine_config"] == sm90_default(m, 321).to_dict()
    assert 0 < rep["registers"] <= 255
    assert rep["ctas_per_sm_fit"] >= rep["engine_config"]["ctas_per_sm"]
    assert rep["grid"] == 132 * rep["engine_config"]["ctas_per_sm"]


def test_a_head_dim_the_kernel_cannot_take_is_refused_by_name():
    m = _model("SmolLM2-360M").replace(num_heads=32, hidden_size=2560, head_dim=80)     # h2o-danube's heads
    with pytest.raises(ConfigError, match="head_dim 80"):
        make_plan(m, sm90_default(m), 132)
