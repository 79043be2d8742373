"""The canonical in-memory weight layout every engine part uses, and how it is filled.

    embed                [V, H]
    layers.{i}.attn_norm [H]
    layers.{i}.wqkv      [q + 2*kv, H]    q rows, then k rows, then v rows (HF order inside each)
    layers.{i}.bqkv      [q + 2*kv]       only with attention_bias (Qwen2)
    layers.{i}.q_norm    [head_dim]       only with qk_norm (Qwen3)
    layers.{i}.k_norm    [head_dim]
    layers.{i}.wo        [H, q]
    layers.{i}.ffn_norm  [H]
    layers.{i}.w_gate    [I, H]
    layers.{i}.w_up      [I, H]
    layers.{i}.w_down    [H, I]
    norm                 [H]
    lm_head              [V, H]           the same tensor object as embed when tied

All in the model dtype on one device. Sources: a Hugging Face checkpoint directory (load_checkpoint: config.json
plus *.safetensors or a sharded index, read lazily tensor by tensor with safetensors.safe_open), seeded random
tensors at realistic scale (random_weights), or a spec: a preset, a directory or a Hub id already in the local
Hugging Face cache (resolve_model). save_checkpoint writes Weights back in the HF layout (tests build
checkpoints with it and round-trip).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
import torch

from kog.engine.config import COMPUTE_DTYPES, DTYPES, PRESETS, ConfigError, ModelConfig, check_checkpoint_file, preset

# safetensors dtype strings a checkpoint tensor may be stored in; each is cast to the model dtype on load.
_STORAGE_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


class Weights(dict):
    """name -> tensor, in the canonical layout above. A plain dict with a few conveniences."""

    @property
    def dtype(self) -> torch.dtype:
        return self["embed"].dtype

    @property
    def device(self) -> torch.device:
        return self["embed"].device

    @property
    def tied(self) -> bool:
        return self.get("lm_head") is self.get("embed")

    def nbytes(self) -> int:
        """Bytes held (a tied lm_head counted once)."""
        seen, n = set(), 0
        for t in self.values():
            if id(t) not in seen:
                seen.add(id(t))
                n += t.numel() * t.element_size()
        return n

    def layer(self, i: int) -> dict[str, torch.Tensor]:
        """The tensors of layer i under their short names (attn_norm, wqkv, ...)."""
        pre = f"layers.{i}."
        return {k[len(pre):]: v for k, v in self.items() if k.startswith(pre)}


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Canonical name -> shape, in load order."""
    H, I, V, hd = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    out: dict[str, tuple[int, ...]] = {"embed": (V, H)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        out[p + "attn_norm"] = (H,)
        out[p + "wqkv"] = (cfg.qkv_size, H)
        if cfg.attention_bias:
            out[p + "bqkv"] = (cfg.qkv_size,)
        if cfg.qk_norm:
            out[p + "q_norm"] = (hd,)
            out[p + "k_norm"] = (hd,)
        out[p + "wo"] = (H, cfg.q_size)
        out[p + "ffn_norm"] = (H,)
        out[p + "w_gate"] = (I, H)
        out[p + "w_up"] = (I, H)
        out[p + "w_down"] = (H, I)
    out["norm"] = (H,)
    out["lm_head"] = (V, H)
    return out


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF checkpoint tensor name -> shape, for every tensor kog reads."""
    H, I, V, hd = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (H,)
        for proj, n in (("q_proj", cfg.q_size), ("k_proj", cfg.kv_size), ("v_proj", cfg.kv_size)):
            out[p + f"self_attn.{proj}.weight"] = (n, H)
            if cfg.attention_bias:
                out[p + f"self_attn.{proj}.bias"] = (n,)
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = (hd,)
            out[p + "self_attn.k_norm.weight"] = (hd,)
        out[p + "self_attn.o_proj.weight"] = (H, cfg.q_size)
        out[p + "post_attention_layernorm.weight"] = (H,)
        out[p + "mlp.gate_proj.weight"] = (I, H)
        out[p + "mlp.up_proj.weight"] = (I, H)
        out[p + "mlp.down_proj.weight"] = (H, I)
    out["model.norm.weight"] = (H,)
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (V, H)
    return out


# ---- checkpoint loading -----------------------------------------------------------------------------------

def _read_json(path: Path, what: str) -> dict:
    from kog.fsutil import InputPathError, read_regular_text
    try:
        text = read_regular_text(path, what)
    except InputPathError as e:
        raise ConfigError(str(e)) from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not UTF-8 text") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{what} {path} must hold a JSON object")
    return obj


def read_config(ckpt: str | os.PathLike) -> ModelConfig:
    """ModelConfig of a checkpoint directory (config.json, plus generation_config.json's EOS ids if present)."""
    d = Path(ckpt)
    cp = d / "config.json"
    if not cp.exists():
        raise ConfigError(f"checkpoint {d}: no config.json")
    raw = _read_json(cp, "config")
    cfg = ModelConfig.from_hf(raw, name=d.resolve().name)
    gp = d / "generation_config.json"
    if gp.is_file():
        try:
            g = _read_json(gp, "generation config")
            eos = g.get("eos_token_id")
            extra = eos if isinstance(eos, list) else ([eos] if isinstance(eos, int) else [])
            ids = tuple(dict.fromkeys([*cfg.eos_token_id, *(int(e) for e in extra)]))
            cfg = cfg.replace(eos_token_id=ids)
        except Exception:  # generation_config is optional metadata: never fatal
            pass
    return cfg


def _tensor_index(d: Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it."""
    idx = d / "model.safetensors.index.json"
    if idx.is_file():
        wm = _read_json(idx, "safetensors index").get("weight_map")
        if not isinstance(wm, dict):
            raise ConfigError(f"safetensors index {idx}: field 'weight_map' is missing or not an object")
        return {str(k): d / str(v) for k, v in wm.items()}
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"checkpoint {d}: no *.safetensors files (and no model.safetensors.index.json)")
    from safetensors import safe_open
    out: dict[str, Path] = {}
    for f in files:
        check_checkpoint_file(f, "safetensors file")
        try:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    out[k] = f
        except Exception as e:
            raise ConfigError(f"cannot read safetensors file {f}: {e}") from None
    return out


class _Reader:
    """Lazy per-tensor reads across the shard files, each file opened once."""

    def __init__(self, index: dict[str, Path]):
        self.index = index
        self.handles: dict[Path, object] = {}

    def _handle(self, f: Path):
        from safetensors import safe_open
        if f not in self.handles:
            if not f.is_file():
                raise ConfigError(f"safetensors file {f} (named by the index) does not exist")
            try:
                self.handles[f] = safe_open(str(f), framework="pt")
            except Exception as e:
                raise ConfigError(f"cannot read safetensors file {f}: {e}") from None
        return self.handles[f]

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
        f = self.index.get(name)
        if f is None:
            raise ConfigError(f"missing tensor {name}")
        h = self._handle(f)
        try:
            sl = h.get_slice(name)
            st_dtype, got = sl.get_dtype(), tuple(sl.get_shape())
        except Exception as e:
            raise ConfigError(f"tensor {name}: cannot read from {f.name}: {e}") from None
        if st_dtype not in _STORAGE_DTYPES:
            raise ConfigError(f"tensor {name}: unsupported dtype {st_dtype} "
                              f"(supported: {', '.join(_STORAGE_DTYPES)})")
        if got != tuple(shape):
            raise ConfigError(f"tensor {name}: expected {list(shape)}, got {list(got)}")
        try:
            t = h.get_tensor(name)
        except Exception as e:
            raise ConfigError(f"tensor {name}: cannot read from {f.name}: {e}") from None
        t = t.to(device=device, dtype=dtype)
        check_finite(name, t, f" (in {f.name}" + (f", as {str(dtype).replace('torch.', '')})"
                                                  if _STORAGE_DTYPES[st_dtype] != dtype else ")"))
        return t


def _model_dtype(cfg: ModelConfig, dtype) -> str:
    if dtype is None:
        # The engine runs 16-bit; a float32 checkpoint runs in bfloat16 unless asked otherwise.
        return cfg.dtype if cfg.dtype in DTYPES else "bfloat16"
    name = str(dtype).replace("torch.", "")
    if name not in COMPUTE_DTYPES:
        raise ConfigError(f"unsupported dtype {name!r} (supported: {', '.join(COMPUTE_DTYPES)})")
    return name


def load_checkpoint(ckpt: str | os.PathLike, device="cpu", dtype=None) -> tuple[ModelConfig, Weights]:
    """(config, weights) of an HF checkpoint directory; every tensor's presence, dtype and shape checked.

    dtype: None -> the config's torch_dtype (bfloat16 for a float32 checkpoint); or a torch dtype / name
    ("float32" is allowed for the reference oracle). Extra tensors (rotary inv_freq, a tied lm_head copy)
    are ignored.
    """
    d = Path(ckpt)
    if not d.is_dir():
        raise ConfigError(f"checkpoint {d} is not a directory")
    cfg = read_config(d)
    cfg = cfg.replace(dtype=_model_dtype(cfg, dtype)).validate()
    tdt = cfg.torch_dtype
    rd = _Reader(_tensor_index(d))
    shapes = hf_tensor_shapes(cfg)

    def get(name: str) -> torch.Tensor:
        return rd.get(name, shapes[name], tdt, device)

    w = Weights()
    with torch.no_grad():
        w["embed"] = get("model.embed_tokens.weight")
        for i in range(cfg.num_layers):
            p, q = f"model.layers.{i}.", f"layers.{i}."
            w[q + "attn_norm"] = get(p + "input_layernorm.weight")
            w[q + "wqkv"] = torch.cat([get(p + f"self_attn.{x}_proj.weight") for x in "qkv"], 0)
            if cfg.attention_bias:
                w[q + "bqkv"] = torch.cat([get(p + f"self_attn.{x}_proj.bias") for x in "qkv"], 0)
            if cfg.qk_norm:
                w[q + "q_norm"] = get(p + "self_attn.q_norm.weight")
                w[q + "k_norm"] = get(p + "self_attn.k_norm.weight")
            w[q + "wo"] = get(p + "self_attn.o_proj.weight")
            w[q + "ffn_norm"] = get(p + "post_attention_layernorm.weight")
            w[q + "w_gate"] = get(p + "mlp.gate_proj.weight")
            w[q + "w_up"] = get(p + "mlp.up_proj.weight")
            w[q + "w_down"] = get(p + "mlp.down_proj.weight")
        w["norm"] = get("model.norm.weight")
        w["lm_head"] = w["embed"] if cfg.tie_word_embeddings else get("lm_head.weight")
    check_weights(cfg, w, finite=False)        # each tensor was checked for NaN/Inf as it was read
    return cfg, w


_FINITE_CHUNK = 1 << 24    # elements per isfinite pass: bounds the temporary mask (16 MB), not the speed


def check_finite(name: str, t: torch.Tensor, where: str = "") -> None:
    """ConfigError naming `name` and the first index of a NaN or Inf in `t`: one such weight makes every
    logit NaN, and argmax of NaN logits is token 0 forever, a silent garbage generation."""
    if not t.is_floating_point():
        return
    flat = t.reshape(-1)
    for i in range(0, flat.numel(), _FINITE_CHUNK):
        ok = torch.isfinite(flat[i:i + _FINITE_CHUNK])
        if not bool(ok.all()):
            j = i + int((~ok).nonzero()[0, 0])
            idx = list(torch.unravel_index(torch.tensor(j), tuple(t.shape)))
            raise ConfigError(f"tensor {name}{where} has a non-finite value ({float(flat[j])}) at "
                              f"{[int(x) for x in idx]}: kog refuses NaN/Inf weights")


def check_weights(cfg: ModelConfig, w: Weights, finite: bool = True) -> None:
    """ConfigError naming the first canonical tensor that is missing, misshapen or (finite=True) holds a
    NaN or Inf. The engines call it before building anything from the weights."""
    for name, shape in expected_shapes(cfg).items():
        t = w.get(name)
        if t is None:
            raise ConfigError(f"missing tensor {name}")
        if tuple(t.shape) != shape:
            raise ConfigError(f"tensor {name}: expected {list(shape)}, got {list(t.shape)}")
    if finite:
        seen: set[int] = set()
        for name in expected_shapes(cfg):
            if id(w[name]) not in seen:                # a tied lm_head is the embedding: checked once
                seen.add(id(w[name]))
                check_finite(name, w[name])


# ---- random weights ---------------------------------------------------------------------------------------

def random_weights(cfg: ModelConfig, device="cpu", seed: int = 0, dtype=None) -> Weights:
    """Seeded random weights at a realistic scale, so activations and logits are not degenerate.

    Matrices ~ N(0, 1/K) (unit-variance outputs for unit-variance inputs); the embedding ~ N(0, 4/H) so that
    tied logits (normed hidden . embedding row) have a standard deviation of about 2; norms ~ 1 + N(0, 0.1^2);
    biases ~ N(0, 0.1^2). Same (cfg, device, seed) -> same tensors.
    """
    dt = getattr(torch, _model_dtype(cfg, dtype))
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    H, V = cfg.hidden_size, cfg.vocab_size

    def normal(shape, std, mean=0.0):
        t = torch.randn(shape, generator=g, device=device, dtype=dt)
        return t.mul_(std).add_(mean) if mean else t.mul_(std)

    w = Weights()
    with torch.no_grad():
        for name, shape in expected_shapes(cfg).items():
            if name == "embed":
                w[name] = normal(shape, 2.0 / H ** 0.5)
            elif name == "lm_head":
                w[name] = w["embed"] if cfg.tie_word_embeddings else normal(shape, 2.0 / H ** 0.5)
            elif len(shape) == 2:
                w[name] = normal(shape, 1.0 / shape[1] ** 0.5)
            elif name.endswith("bqkv"):
                w[name] = normal(shape, 0.1)
            else:  # a norm weight
                w[name] = normal(shape, 0.1, mean=1.0)
    return w


def placeholder_weights(cfg: ModelConfig, device="cpu") -> Weights:
    """Every canonical tensor at its shape in the model's dtype, all views (stride 0) of one zeroed 128-byte
    line: what compiling the engine's kernel needs (dtypes, shapes, a 128-byte aligned address), without
    the model's bytes (kogtune's compile processes). Every value is 0: never for computing."""
    dt = getattr(torch, _model_dtype(cfg, None))
    line = torch.zeros(128 // torch.tensor([], dtype=dt).element_size(), dtype=dt, device=device)
    w = Weights()
    for name, shape in expected_shapes(cfg).items():
        w[name] = line[:1].expand(shape)
    if cfg.tie_word_embeddings:
        w["lm_head"] = w["embed"]
    return w


def resolve_config(spec: str | os.PathLike, dtype=None) -> ModelConfig:
    """The config resolve_model returns for `spec`, without reading or making any weights."""
    where = locate_model(spec)
    if isinstance(where, Path):
        cfg = read_config(where)
        return _named(cfg.replace(dtype=_model_dtype(cfg, dtype)).validate(), spec)     # as load_checkpoint
    cfg = preset(where)
    return cfg.replace(dtype=_model_dtype(cfg, dtype)) if dtype is not None else cfg


def _named(cfg: ModelConfig, spec: str | os.PathLike) -> ModelConfig:
    """A checkpoint's config named by the Hub id it was found by (its snapshot directory is a commit hash)."""
    return cfg if Path(spec).is_dir() else cfg.replace(name=str(spec))


def resolve_model(spec: str | os.PathLike, device="cpu", seed: int = 0, dtype=None) -> tuple[ModelConfig, Weights]:
    """A preset name (random weights), an HF checkpoint directory or a Hub id in the local Hugging Face cache
    (locate_model) -> (config, weights)."""
    where = locate_model(spec)
    if isinstance(where, Path):
        cfg, w = load_checkpoint(where, device, dtype)
        return _named(cfg, spec), w
    cfg = resolve_config(where, dtype)
    w = random_weights(cfg, device, seed)
    check_weights(cfg, w)
    return cfg, w


_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def locate_model(spec: str | os.PathLike) -> str | Path:
    """Where a model spec points: a preset's name (str), or a checkpoint directory (Path): the directory
    itself, or for a Hub id ("org/name") its snapshot in the local Hugging Face cache. Never downloads."""
    s = str(spec)
    if s in PRESETS:
        return s
    if Path(s).is_dir():
        return Path(s)
    known = f"not a preset ({', '.join(PRESETS)}) and not a checkpoint directory"
    if not _HUB_ID.fullmatch(s):
        raise ConfigError(f"unknown model {s!r}: {known}")
    return _hub_snapshot(s, known)


def _hub_snapshot(repo_id: str, known: str) -> Path:
    """The cached snapshot of a Hub model id (huggingface_hub, offline)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ConfigError(f"unknown model {repo_id!r}: {known}, and huggingface_hub is not installed to look "
                          f"it up in the local Hugging Face cache") from None
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:           # not cached (LocalEntryNotFoundError), or an unreadable cache: the same answer
        raise ConfigError(f"unknown model {repo_id!r}: {known}, and not in the local Hugging Face cache (kog "
                          f"never downloads: `huggingface-cli download {repo_id}` first)") from None


# ---- saving -------------------------------------------------------------------------------------------------

def to_hf_state_dict(cfg: ModelConfig, w: Weights) -> dict[str, torch.Tensor]:
    """Weights -> HF tensor names (q/k/v split back out); contiguous CPU tensors."""
    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": w["embed"]}
    sizes = [cfg.q_size, cfg.kv_size, cfg.kv_size]
    for i in range(cfg.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        out[p + "input_layernorm.weight"] = w[q + "attn_norm"]
        for x, t in zip("qkv", torch.split(w[q + "wqkv"], sizes, 0)):
            out[p + f"self_attn.{x}_proj.weight"] = t
        if cfg.attention_bias:
            for x, t in zip("qkv", torch.split(w[q + "bqkv"], sizes, 0)):
                out[p + f"self_attn.{x}_proj.bias"] = t
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = w[q + "q_norm"]
            out[p + "self_attn.k_norm.weight"] = w[q + "k_norm"]
        out[p + "self_attn.o_proj.weight"] = w[q + "wo"]
        out[p + "post_attention_layernorm.weight"] = w[q + "ffn_norm"]
        out[p + "mlp.gate_proj.weight"] = w[q + "w_gate"]
        out[p + "mlp.up_proj.weight"] = w[q + "w_up"]
        out[p + "mlp.down_proj.weight"] = w[q + "w_down"]
    out["model.norm.weight"] = w["norm"]
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = w["lm_head"]
    return {k: v.detach().to("cpu").contiguous() for k, v in out.items()}


_HF_ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM"}


def hf_config_dict(cfg: ModelConfig) -> dict:
    """ModelConfig -> an HF config.json dict (transformers 4.x layout, which 5.x also reads)."""
    d = {
        "architectures": [_HF_ARCH[cfg.arch]], "model_type": cfg.arch,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "rope_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling else None,
        "tie_word_embeddings": cfg.tie_word_embeddings, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": (cfg.eos_token_id[0] if len(cfg.eos_token_id) == 1 else list(cfg.eos_token_id)) or None,
        "torch_dtype": cfg.dtype,
    }
    if cfg.arch == "llama":
        d["attention_bias"] = False
        d["mlp_bias"] = False
    if cfg.arch == "qwen3":
        d["attention_bias"] = False
    if cfg.arch in ("qwen2", "qwen3"):
        d["use_sliding_window"] = False
    if cfg.arch == "mistral":
        d["sliding_window"] = cfg.sliding_window
    return d


def save_checkpoint(cfg: ModelConfig, w: Weights, out_dir: str | os.PathLike, max_shard_bytes: int | None = None) -> Path:
    """Write Weights as an HF checkpoint directory (config.json + safetensors, sharded with an index when
    max_shard_bytes is given and exceeded)."""
    from safetensors.torch import save_file
    from kog.fsutil import atomic_output, atomic_write_text
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_text(d / "config.json", json.dumps(hf_config_dict(cfg), indent=1) + "\n")
    sd = to_hf_state_dict(cfg, w)
    meta = {"format": "pt"}
    if max_shard_bytes is None or sum(t.numel() * t.element_size() for t in sd.values()) <= max_shard_bytes:
        with atomic_output(d / "model.safetensors") as tmp:
            save_file(sd, str(tmp), metadata=meta)
        return d
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k, t in sd.items():
        nb = t.numel() * t.element_size()
        if shards[-1] and size + nb > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = t
        size += nb
    n = len(shards)
    weight_map = {}
    for j, sh in enumerate(shards, 1):
        fname = f"model-{j:05d}-of-{n:05d}.safetensors"
        with atomic_output(d / fname) as tmp:
            save_file(sh, str(tmp), metadata=meta)
        weight_map.update({k: fname for k in sh})
    total = sum(t.numel() * t.element_size() for t in sd.values())
    atomic_write_text(d / "model.safetensors.index.json",
                      json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1) + "\n")
    return d

