"""ModelConfig.from_hf for both transformers config layouts, and its refusals."""
from __future__ import annotations

import pytest

from kog.engine.config import PRESETS, ConfigError, ModelConfig, preset

BASE = {"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "torch_dtype": "bfloat16"}
L3 = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def test_presets_validate_and_sizes():
    for name, c in PRESETS.items():
        assert c.validate() is c and c.name == name
    c = preset("llama-3.2-1b")
    assert abs(c.num_params() - 1.2358e9) / 1.2358e9 < 1e-3            # Llama-3.2-1B's published count
    assert c.weight_bytes_per_token() == 2471632896
    assert c.replace(dtype="float32").weight_bytes_per_token() == 2 * c.weight_bytes_per_token()
    # the published parameter counts of the checkpoints the presets copy
    for name, params in (("qwen2.5-3b", 3.09e9), ("llama-3.1-8b", 8.03e9), ("llama-3.2-3b", 3.21e9)):
        assert abs(preset(name).num_params() - params) / params < 5e-3, name


def test_rope_v4_and_v5_layouts_agree():
    v4 = ModelConfig.from_hf({**BASE, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **L3}})
    v5 = ModelConfig.from_hf({**BASE, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", **L3}})
    assert v4.rope_theta == v5.rope_theta == 500000.0
    assert v4.rope_scaling["factor"] == v5.rope_scaling["factor"] == 32.0
    plain = ModelConfig.from_hf({**BASE, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}})
    assert plain.rope_scaling is None and plain.rope_theta == 1e6


def test_arch_specific_fields():
    q2 = ModelConfig.from_hf({**BASE, "architectures": ["Qwen2ForCausalLM"]})
    assert q2.attention_bias and not q2.qk_norm
    q3 = ModelConfig.from_hf({**BASE, "architectures": ["Qwen3ForCausalLM"], "head_dim": 32})
    assert q3.qk_norm and not q3.attention_bias and q3.head_dim == 32
    m = ModelConfig.from_hf({**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": 4096})
    assert m.sliding_window == 4096
    assert ModelConfig.from_hf({**BASE, "dtype": "float16", "torch_dtype": None}).dtype == "float16"
    assert ModelConfig.from_hf({**BASE, "eos_token_id": [5, 6]}).eos_token_id == (5, 6)


@pytest.mark.parametrize("patch, field", [
    ({"architectures": ["GPTNeoXForCausalLM"]}, "architectures"),
    ({"architectures": []}, "architectures"),
    ({"hidden_size": None}, "hidden_size"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"torch_dtype": "int8"}, "torch_dtype"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling.low_freq_factor"),
    ({"vocab_size": "many"}, "vocab_size"),
])
def test_refusals_name_the_field(patch, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        ModelConfig.from_hf({**BASE, **patch})


def test_not_an_object():
    with pytest.raises(ConfigError, match="JSON object"):
        ModelConfig.from_hf([1, 2])
    with pytest.raises(ConfigError, match="not a preset"):
        preset("nope")
