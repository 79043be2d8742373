"""Tuned-config store: the best EngineConfig per (device, model shape, dtype, kog version), one JSON file.

Location: $KOG_TUNED_DIR/tuned.json, else ~/.cache/kog/tuned.json. `kogtune bench` and `kogtune generate` run
`tuned_config(model_cfg, device)`: the user's stored config (best_config), else kog's own measured one
(builtin_config), else the platform default; `kogtune show` lists the entries. Writes are atomic (temp +
rename).
The shape signature covers every field that changes the kernel's work (not the model's name), so a
checkpoint and the preset of the same architecture share their tuned config.
Only single-GPU configs are stored (what the engine runs by default): a `kogtune search --tp` whose best
trial is tensor-parallel stores its best single-GPU trial and records the TP best in the entry's
source["tp_best"] ({"G", "exchange_rows", "tok_per_s", "number"}), which `kogtune show` prints beside it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from kog.engine.config import ModelConfig
from kog.engine.engine_config import EngineConfig

# EngineConfig fields of engine paths that were removed because they measured slower than the paths kept
# (docs/engine-notes.md has the measurements), and max_spin, the spin bound in polls that wait_timeout_s (a
# bound in seconds) replaced. A store written by an older kog, or a study it started, may still hold them:
# reading drops them, so such a config runs as the same config without them.
RETIRED_FIELDS = ("prefetch", "blocked_prefetch", "row_prefetch", "pipeline_stages", "flat_loop", "max_spin")

SHAPE_FIELDS = ("arch", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim", "attention_bias", "qk_norm", "tie_word_embeddings")


def store_path() -> Path:
    d = os.environ.get("KOG_TUNED_DIR")
    return (Path(d) if d else Path.home() / ".cache" / "kog") / "tuned.json"


def kog_version() -> str:
    try:
        from kog import __version__
        return str(__version__)
    except Exception:
        return "0"


def shape_signature(model: ModelConfig) -> str:
    d = {k: getattr(model, k) for k in SHAPE_FIELDS}
    h = hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]
    return f"{model.arch}-h{model.hidden_size}-i{model.intermediate_size}-l{model.num_layers}-{h}"


def entry_key(device_name: str, model: ModelConfig, version: str | None = None) -> str:
    return "|".join([device_name, shape_signature(model), model.dtype, version or kog_version()])


def _load(path: Path, user_store: bool = True) -> dict[str, Any]:
    """The store at `path`; one that cannot be parsed reads as empty. The user's store is then kept aside
    (tuned.json.corrupt-<n>, named in a warning) so the next save cannot overwrite what it held; kog's own
    BUILTIN file is never moved."""
    empty = {"format": "kog-tuned", "entries": {}}
    from kog.fsutil import InputPathError, read_regular_text
    try:
        d = json.loads(read_regular_text(path, "tuned-config store"))
        if not isinstance(d, dict) or not isinstance(d.get("entries"), dict):
            raise ValueError("not a kog tuned-config store: no 'entries' object")
        return d
    except FileNotFoundError:
        return empty
    except InputPathError:      # a FIFO or device where the store should be: named, never moved or read
        raise
    except Exception as e:
        if user_store:
            from kog.fsutil import set_aside_corrupt
            set_aside_corrupt(path, f"{type(e).__name__}: {str(e)[:120]}")
        return empty


def save_best(device_name: str, model: ModelConfig, cfg: EngineConfig, tok_per_s: float,
              source: dict[str, Any] | None = None, only_if_better: bool = True) -> bool:
    """Store `cfg` for this key (kept if an equal-or-better one is stored already). True if written."""
    from kog.fsutil import locked
    path = store_path()
    with locked(path):        # another search saving at the same time keeps its entry too
        return _save_locked(path, device_name, model, cfg, tok_per_s, source, only_if_better)


def _save_locked(path: Path, device_name: str, model: ModelConfig, cfg: EngineConfig, tok_per_s: float,
                 source: dict[str, Any] | None, only_if_better: bool) -> bool:
    from kog.runstore import atomic_write_json
    import datetime as _dt
    d = _load(path)
    key = entry_key(device_name, model)
    old = d["entries"].get(key)
    if only_if_better and old:
        ob, nb = old.get("source", {}).get("backend"), (source or {}).get("backend")
        if ob == "gpu" and nb != "gpu":
            return False          # a prediction never replaces a measurement
        if ob == nb and old.get("tok_per_s", 0) >= tok_per_s:
            return False
    d["entries"][key] = {
        "device": device_name, "model": model.name, "shape": shape_signature(model), "dtype": model.dtype,
        "kog_version": kog_version(), "tok_per_s": float(tok_per_s), "config": cfg.to_dict(),
        "source": source or {}, "saved": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    atomic_write_json(path, d)
    return True


def engine_config(d: dict[str, Any]) -> EngineConfig:
    """An EngineConfig from a stored dict, the RETIRED_FIELDS dropped (ConfigError for any other unknown field)."""
    return EngineConfig.from_dict({k: v for k, v in d.items() if k not in RETIRED_FIELDS})


def best_config(device_name: str, model_cfg: ModelConfig, include_simulated: bool = False) -> EngineConfig | None:
    """The stored config for this device and model shape, or None. Simulated results are not used by the
    engine unless asked (a prediction is not a measurement)."""
    e = _load(store_path())["entries"].get(entry_key(device_name, model_cfg))
    if not e:
        return None
    if e.get("source", {}).get("backend") == "sim" and not include_simulated:
        return None
    try:
        return engine_config(e["config"])
    except Exception:
        return None


BUILTIN = Path(__file__).resolve().parent / "data" / "builtin_tuned.json"


def builtin_config(device_name: str, model_cfg: ModelConfig) -> EngineConfig | None:
    """kog's own measured config for this device and model shape (tune/data/builtin_tuned.json: tilings that
    sweeps on the lent H200 found and the committed bench ran, with the file that shows it), or None.
    Matched on device, shape signature and dtype, not on kog's version. tuned_config consults it after the
    user's store (best_config) and before the platform's built-in rule."""
    e = builtin_entry(device_name, model_cfg)
    try:
        return None if e is None else engine_config(e["config"])
    except Exception:
        return None


def builtin_entry(device_name: str, model_cfg: ModelConfig) -> dict[str, Any] | None:
    """The built-in table's entry (config, tok/s, source study) for this device and model shape, or None."""
    sig = shape_signature(model_cfg)
    for e in _load(BUILTIN, user_store=False)["entries"].values():
        if e.get("device") == device_name and e.get("shape") == sig and e.get("dtype") == model_cfg.dtype:
            return e
    return None


def _device_name(device=None) -> str:
    """The name the store keys configs by: the CUDA device's name, "cpu" without one."""
    try:
        import torch
        return torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


def tuned_config(model_cfg: ModelConfig, device=None, span: int | None = None) -> EngineConfig:
    """The config to run `model_cfg` with on `device` for a cache of `span` positions: the user's stored config
    (best_config), else kog's own measured one (builtin_config), the first that fits the span
    (kog.engine.engine_config.fits); else the platform's default for that span
    (kog.engine.monokernel.platform_default)."""
    return tuned_choice(model_cfg, device, span)[0]


def tuned_choice(model_cfg: ModelConfig, device=None, span: int | None = None) -> tuple[EngineConfig, str]:
    """tuned_config's config and where it came from: "stored" (the user's store), "built-in entry, study NAME" or
    "rule"."""
    from kog.engine.engine_config import fits
    name = _device_name(device)
    for lookup in (_stored_choice, _builtin_choice):
        try:
            cfg, source = lookup(name, model_cfg)
            if cfg is not None and fits(cfg, model_cfg, span):
                return cfg, source
        except Exception:     # an unreadable entry must not stop the engine: the next source answers
            continue
    from kog.engine.monokernel import platform_default
    return platform_default(model_cfg, device, span), "rule"


def _stored_choice(device_name: str, model_cfg: ModelConfig) -> tuple[EngineConfig | None, str]:
    return best_config(device_name, model_cfg), "stored"


def _builtin_choice(device_name: str, model_cfg: ModelConfig) -> tuple[EngineConfig | None, str]:
    """The built-in entry's config (engine_config raises on an unreadable one) and its source, study named."""
    e = builtin_entry(device_name, model_cfg)
    if e is None:
        return None, ""
    study = (e.get("source") or {}).get("study")
    return engine_config(e["config"]), f"built-in entry, study {study}" if study else "built-in entry"


def entries() -> list[dict[str, Any]]:
    return list(_load(store_path())["entries"].values())


def _short(cfg: dict[str, Any]) -> str:
    """An EngineConfig dict as key=value words (wait_timeout_s left out), as `kogtune show` prints it."""
    return " ".join(f"{k}={v}" for k, v in cfg.items() if k != "wait_timeout_s")


def cli_show(args) -> int:
    es = entries()
    builtin = list(_load(BUILTIN, user_store=False)["entries"].values())
    if getattr(args, "json", False):
        print(json.dumps({"store": str(store_path()), "entries": es, "builtin": builtin}, indent=1))
        return 0
    for e in builtin:     # kog's own measured defaults: what the engine runs where the store has nothing
        print(f"built in ({BUILTIN.name}): {e.get('device')} {e.get('model')} ({e.get('shape')}) "
              f"{e.get('tok_per_s', 0):.1f} tok/s: {_short(e.get('config', {}))}")
    if not es:
        print(f"no tuned configs stored ({store_path()}); run `kogtune search`")
        return 0
    from rich.table import Table
    t = Table(title=f"tuned configs ({store_path()})")
    for c in ("device", "model", "dtype", "kog", "tok/s", "backend", "config"):
        t.add_column(c)
    for e in es:
        t.add_row(e.get("device", "?"), f"{e.get('model')} ({e.get('shape')})", e.get("dtype", "?"),
                  e.get("kog_version", "?"), f"{e.get('tok_per_s', 0):.1f}", e.get("source", {}).get("backend", "?"),
                  _short(e.get("config", {})))
    import sys
    from kog.clitools import stdout_console
    con = stdout_console(**({"width": 200} if sys.stdout.isatty() else {}))   # a pipe gets whole rows
    con.print(t)
    for e in es:
        tb = e.get("source", {}).get("tp_best")
        if tb:
            con.print(f"{e.get('model')} on {e.get('device')}: tensor-parallel best G={tb.get('G')} exchange_rows "
                      f"{tb.get('exchange_rows')} {float(tb.get('tok_per_s', 0)):.1f} tok/s (study "
                      f"{e.get('source', {}).get('study')}, trial {tb.get('number')}); not stored as the engine "
                      f"default, which is single-GPU")
    return 0
