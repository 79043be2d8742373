"""The search space: Optuna define-by-run over EngineConfig's knobs, with constraints checked before launch.

Choices are fixed per (model, device) so a study keeps one distribution per parameter across runs and
hosts; choices a model cannot use (a tile that does not divide a phase's rows) stay in the list and are
rejected by EngineConfig.validate() before any launch (the trial is PRUNED with its reason in the user
attribute 'fail_reason'). sync_rows is only sampled in targeted mode (grid mode has no counters).
The "topology" mapping is offered when this device has a kogprobe scan (its CTA->SM placement and
bandwidth-vs-SMs table are what the mapping is built from). --workers parallelises the search, not the
model.

Tensor parallelism (`kogtune search --tp 1,2,4`): Space.tp_degrees / Space.exchange_rows. Only when more than
one degree is offered does suggest() sample "tp_degree" (and, for a degree > 1, "exchange_rows": hidden rows
per cross-GPU exchange chunk), so a study without --tp keeps exactly its old parameters. The TP choices are
not EngineConfig fields: they live in the trial params and the payload's "tp" ({"G", "exchange_rows"});
config_from_params ignores them. check_tp() rejects before any launch (PRUNED, 'fail_reason'): a degree
above the GPUs the search has, a mode other than targeted, the weight ring, a model that does not shard over
G (kog.engine.tp.shard_config), an engine config the rank's shard cannot run, and an exchange_rows that
kog.engine.tp_monokernel.check_exchange_rows refuses. A degree-1 trial runs the single-GPU engine.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from kog.engine.config import ModelConfig, PRESETS, preset
from kog.engine.engine_config import MAPPINGS, SYNC_MODES, EngineConfig

BN_CHOICES = (1, 2, 4, 8, 16, 32)
BLOCK_K_CHOICES = (256, 512, 1024, 2048, 4096)
WARPS_CHOICES = (2, 4, 8)
CTAS_CHOICES = (1, 2, 3, 4, 5, 6, 8)
SYNC_ROWS_CHOICES = (0, 16, 64, 256, 1024, 2048, 4096, 8192)   # 4096: the engine default
ATTN_BLOCK_CHOICES = (32, 64, 128)
# shared-memory weight ring slots (0: off; the ring needs NVIDIA sm_90); 4 and 6 fit one CTA per SM, which
# then keeps the bytes in flight per SM that 2 and 3 slots keep at two CTAs
WEIGHT_RING_CHOICES = (0, 2, 3, 4, 6)
EXCHANGE_ROWS_CHOICES = (64, 128, 256)
MAX_TP = 8                  # GPUs of one host the TP engine is built for (G is a power of two <= 8)
PHASES = ("qkv", "o", "gate_up", "down", "lm")


class Infeasible(Exception):
    """A config that cannot run (constraint, residency): rejected before any launch."""


@dataclass
class Space:
    """Per-study choice lists; `suggest(trial)` builds an EngineConfig from an Optuna trial."""
    mappings: tuple[str, ...] = MAPPINGS
    modes: tuple[str, ...] = SYNC_MODES
    ctas: tuple[int, ...] = CTAS_CHOICES
    warps: tuple[int, ...] = WARPS_CHOICES
    block_k: tuple[int, ...] = BLOCK_K_CHOICES
    bn: dict[str, tuple[int, ...]] = field(default_factory=lambda: {p: BN_CHOICES for p in PHASES})
    sync_rows: tuple[int, ...] = SYNC_ROWS_CHOICES
    attn_block: tuple[int, ...] = ATTN_BLOCK_CHOICES
    weight_ring: tuple[int, ...] = (0,)          # build_space(ring=True): WEIGHT_RING_CHOICES
    attn_tile: tuple[int, ...] = (0,)            # build_space(ring=True): (0, 32), asked only for wider splits
    tp_degrees: tuple[int, ...] = (1,)           # > 1 entry: "tp_degree" is a parameter (module docstring)
    exchange_rows: tuple[int, ...] = EXCHANGE_ROWS_CHOICES

    def suggest(self, trial) -> EngineConfig:
        mode = trial.suggest_categorical("mode", list(self.modes))
        kw: dict[str, Any] = {
            "mode": mode,
            "ctas_per_sm": trial.suggest_categorical("ctas_per_sm", list(self.ctas)),
            "num_warps": trial.suggest_categorical("num_warps", list(self.warps)),
            "block_k": trial.suggest_categorical("block_k", list(self.block_k)),
        }
        for ph in PHASES:
            kw["bn_" + ph] = trial.suggest_categorical("bn_" + ph, list(self.bn[ph]))
        kw["sync_rows"] = trial.suggest_categorical("sync_rows", list(self.sync_rows)) if mode == "targeted" else 0
        kw["mapping"] = trial.suggest_categorical("mapping", list(self.mappings))
        kw["attn_block"] = trial.suggest_categorical("attn_block", list(self.attn_block))
        if len(self.attn_tile) > 1 and kw["attn_block"] > max(self.attn_tile):
            # define-by-run: a split wider than the tile may walk it in tiles (the ring keeps its slots)
            kw["attn_tile"] = trial.suggest_categorical("attn_tile", list(self.attn_tile))
        if len(self.weight_ring) > 1:     # a single choice (a device without the ring) samples nothing
            kw["weight_ring"] = trial.suggest_categorical("weight_ring", list(self.weight_ring))
        else:
            kw["weight_ring"] = self.weight_ring[0]
        if len(self.tp_degrees) > 1:
            g = trial.suggest_categorical("tp_degree", list(self.tp_degrees))
            if g > 1:
                trial.suggest_categorical("exchange_rows", list(self.exchange_rows))
        return EngineConfig(**kw)

    def to_dict(self) -> dict[str, Any]:
        import dataclasses
        return dataclasses.asdict(self)

    def replay(self, params: dict[str, Any]) -> tuple[EngineConfig, dict[str, Any], dict[str, list]]:
        """(config, the params suggest() asks for, their choice lists) of `params` replayed through suggest():
        a parameter it asks for and `params` lacks takes its first choice, one it does not ask for is dropped
        (a grid-mode config has no sync_rows)."""
        asked: dict[str, Any] = {}
        choices: dict[str, list] = {}

        class _Replay:
            def suggest_categorical(self, name, options):
                choices[name] = list(options)
                asked[name] = params.get(name, options[0])
                return asked[name]

        return self.suggest(_Replay()), asked, choices

    def neighbors(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The params one knob away from `params`, in suggest()'s order: each numeric knob moved to the
        choices on either side of its value, each named one (mode, mapping) to every other choice. A local
        search's first steps: the engine default is built by rules that are a local optimum on the shapes
        they were measured on, and one knob moved is where a new shape most often differs (docs/tuning.md)."""
        _, base, choices = self.replay(params)
        out: list[dict[str, Any]] = []
        seen = {json.dumps(base, sort_keys=True)}
        for name, opts in choices.items():
            if base[name] not in opts:
                continue
            i = opts.index(base[name])
            if ordered(opts):
                moves = [opts[j] for j in (i - 1, i + 1) if 0 <= j < len(opts)]
            else:
                moves = [o for o in opts if o != base[name]]
            for v in moves:
                _, p, _ = self.replay({**base, name: v})
                key = json.dumps(p, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    out.append(p)
        return out


def layer_rows(model: ModelConfig) -> dict[str, int]:
    """Output rows of each GEMV phase of a layer (gate_up: its gate rows; each tile holds as many up rows)."""
    return {"qkv": model.qkv_size, "o": model.hidden_size, "gate_up": model.intermediate_size,
            "down": model.hidden_size}


def ordered(options) -> bool:
    """Whether a knob's choices are numbers in order (a step moves to a neighbouring one), not names."""
    return all(isinstance(o, (int, float)) for o in options)


def ring_capable(device) -> bool:
    """Whether the engine's weight ring (cp.async.bulk + mbarrier) runs on `device` (a DeviceInfo): NVIDIA
    sm_90 and newer. Fake devices count as what they pretend to be."""
    arch = str(getattr(device, "arch", "") or "")
    if getattr(device, "vendor", None) != "nvidia" or not arch.startswith("sm_"):
        return False
    try:
        return int(arch[3:].rstrip("a")) >= 90
    except ValueError:
        return False


def build_space(model: ModelConfig, has_scan: bool = True, ring: bool = False) -> Space:
    """The space for `model`: bn choices that divide each phase's rows; topology only with a scan; the
    weight ring's slot counts only when the device runs it (ring_capable), else weight_ring stays 0 and
    is no parameter (studies made before it existed keep their parameters)."""
    rows = {**layer_rows(model), "lm": model.vocab_size}
    # the LM head's last tile may be ragged (EngineConfig.validate): every bn_lm choice
    bn = {ph: tuple(b for b in BN_CHOICES if rows[ph] % b == 0 or ph == "lm") or (1,) for ph in PHASES}
    maps = MAPPINGS if has_scan else tuple(m for m in MAPPINGS if m != "topology")
    # attn_tile: attention splits walked in tiles, so wide splits keep the ring's slots (EngineConfig.attn_tile)
    return Space(mappings=maps, bn=bn, weight_ring=WEIGHT_RING_CHOICES if ring else (0,),
                 attn_tile=(0, 32) if ring else (0,))


def resolve_model_config(spec: str) -> ModelConfig:
    """A preset name, an HF checkpoint directory or a Hub id in the local Hugging Face cache (what the engine
    and `kogtune bench` accept: kog.engine.weights.locate_model) -> ModelConfig (ConfigError, one line,
    otherwise). Reads only config.json: no weights, no torch for presets."""
    if spec in PRESETS:
        return preset(spec)
    from kog.engine.weights import resolve_config
    return resolve_config(spec)     # a checkpoint's dtype as the engine loads it (float32 on disk: bfloat16)


def hardware_max_ctas_per_sm(cfg: EngineConfig, threads_per_sm: int = 2048) -> int:
    return max(1, min(8, threads_per_sm // (32 * cfg.num_warps)))


def residency_fn(backend: str) -> Callable[[ModelConfig, EngineConfig], int]:
    """How many CTAs of `cfg` fit on one SM: the engine's answer when it has one (compiled kernel's
    registers and shared memory), the simulator's estimate for --backend sim, else the thread limit."""
    if backend == "sim":
        from kog.tune.simulator import max_ctas_per_sm
        return lambda m, c: max_ctas_per_sm(c, m)
    try:
        from kog.engine.monokernel import max_ctas_per_sm as eng  # type: ignore[attr-defined]
        return eng
    except Exception:
        return lambda m, c: hardware_max_ctas_per_sm(c)


def check(cfg: EngineConfig, model: ModelConfig, sms: int,
          max_ctas: Callable[[ModelConfig, EngineConfig], int] | None = None) -> EngineConfig:
    """Raise Infeasible naming the first impossible choice; no launch happens for a rejected config."""
    from kog.engine.config import ConfigError
    mc = max_ctas(model, cfg) if max_ctas is not None else None
    try:
        cfg.validate(model, sms, mc)
    except ConfigError as e:
        raise Infeasible(str(e)) from None
    return cfg


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    from kog.errors import UsageError
    try:
        vals = tuple(sorted({int(v) for v in str(text).split(",") if v.strip()}))
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected comma-separated integers, e.g. {flag} 1,2,4") from None
    if not vals:
        raise UsageError(f"{flag} {text!r}: expected comma-separated integers, e.g. {flag} 1,2,4")
    return vals


def parse_tp_degrees(text: str | None) -> tuple[int, ...]:
    """`--tp 1,2,4` -> (1, 2, 4); UsageError (one line) for a degree that is not a power of two <= MAX_TP.
    None -> (1,): no tensor parallelism, the space of a study without --tp."""
    from kog.errors import UsageError
    if text is None:
        return (1,)
    vals = _int_list(text, "--tp")
    bad = [g for g in vals if g < 1 or g & (g - 1) or g > MAX_TP]
    if bad:
        raise UsageError(f"--tp {text}: tensor-parallel degree {bad[0]} is not a power of two <= {MAX_TP} "
                         f"(1, 2, 4, 8)")
    return vals


def parse_exchange_rows(text: str | None) -> tuple[int, ...]:
    """`--exchange-rows 64,128` -> (64, 128); UsageError for a value that is not a power of two."""
    from kog.errors import UsageError
    if text is None:
        return EXCHANGE_ROWS_CHOICES
    vals = _int_list(text, "--exchange-rows")
    bad = [x for x in vals if x < 1 or x & (x - 1)]
    if bad:
        raise UsageError(f"--exchange-rows {text}: {bad[0]} is not a power of two")
    return vals


def tp_from_params(params: dict[str, Any]) -> tuple[int, int | None]:
    """(G, exchange_rows) of a trial's params: (1, None) for a study without --tp or a degree-1 trial."""
    g = int(params.get("tp_degree", 1))
    return g, (int(params["exchange_rows"]) if g > 1 and "exchange_rows" in params else None)


def check_tp(cfg: EngineConfig, model: ModelConfig, G: int, exchange_rows: int | None, gpus: int, sms: int,
             max_ctas: Callable[[ModelConfig, EngineConfig], int] | None = None) -> None:
    """Raise Infeasible naming the first reason a tensor-parallel choice cannot run (nothing for G == 1).
    Lazy engine imports: only a TP study pays for them."""
    if G == 1:
        return
    if G < 1 or G & (G - 1) or G > MAX_TP:
        raise Infeasible(f"tp_degree {G} is not a power of two <= {MAX_TP}")
    if G > gpus:
        raise Infeasible(f"tp_degree {G} exceeds the {gpus} GPU(s) this search has")
    if cfg.mode != "targeted":
        raise Infeasible(f"tp_degree {G} needs mode 'targeted' (the TP engine has no grid mode), not {cfg.mode!r}")
    if cfg.weight_ring:
        raise Infeasible(f"tp_degree {G} runs without weight_ring (the TP engine refuses it)")
    from kog.engine.config import ConfigError
    from kog.engine.tp import check_lm_tiles, shard_config
    from kog.engine.tp_monokernel import check_exchange_rows
    try:
        shard = shard_config(model, G)
    except ConfigError as e:
        raise Infeasible(f"tp_degree {G}: {e}") from None
    try:                                      # each rank runs the engine on its shard (bn must divide its rows)
        check(cfg, shard, sms, max_ctas)
    except Infeasible as e:
        raise Infeasible(f"tp_degree {G} (rank shard {shard.name}): {e}") from None
    if exchange_rows is None:
        raise Infeasible(f"tp_degree {G} without exchange_rows")
    try:
        check_lm_tiles(cfg.bn_lm, shard)
        check_exchange_rows(model, cfg, int(exchange_rows))
    except ConfigError as e:
        raise Infeasible(f"tp_degree {G}: {e}") from None


def config_from_params(params: dict[str, Any]) -> EngineConfig:
    """An EngineConfig from trial params (missing knobs keep their defaults: sync_rows in grid mode; the
    retired fields of a study an older kog started are dropped: kog.tune.store.RETIRED_FIELDS)."""
    from kog.tune.store import RETIRED_FIELDS
    names = set(EngineConfig.__dataclass_fields__) - set(RETIRED_FIELDS)
    return EngineConfig(**{k: v for k, v in params.items() if k in names})
