"""Hostile input, one row per case: what a user (or a broken disk) can hand kog, and the one clear line and
exit code it must get. Each row runs the CLI in-process through its main(argv) (or calls the API), so the
suite stays fast; a row names the setup it needs ({ckpt}, {fifo}, ...). Add a row for every new case.

A row passes when: the exit code is as expected (2 for bad input), stderr holds exactly one line (argparse
errors: its usage line plus one), that line contains every expected substring, no traceback is printed,
and the row's `after` check (nothing clobbered) holds.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

from kog.engine.config import preset
from kog.engine.weights import random_weights, save_checkpoint


# ---- setups: each makes one thing in tmp and returns the value its {placeholder} takes ------------------
def _ckpt(tmp: Path, name: str = "ck", config: dict | None = None, tensor=None) -> Path:
    """The tiny preset saved as an HF checkpoint; `config` overrides config.json fields, `tensor`
    (name, index, value) poisons one stored value."""
    cfg = preset("tiny")
    d = save_checkpoint(cfg, random_weights(cfg, "cpu", 0), tmp / name)
    if config:
        c = json.loads((d / "config.json").read_text())
        for k, v in config.items():
            if v is _DROP:
                c.pop(k, None)
            else:
                c[k] = v
        (d / "config.json").write_text(json.dumps(c))          # json.dumps writes NaN for a float nan
    if tensor:
        from safetensors.torch import load_file, save_file
        sd = load_file(str(d / "model.safetensors"))
        tname, idx, value = tensor
        sd[tname] = sd[tname].clone()
        sd[tname].view(-1)[idx] = value
        save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


_DROP = object()


def _with_tokenizer(tmp: Path) -> Path:
    """A checkpoint whose tokenizer.json maps 'hello' to id 900: beyond the tiny model's 512."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    d = _ckpt(tmp, "tok")
    t = Tokenizer(WordLevel({"[UNK]": 0, "hello": 900}, unk_token="[UNK]"))
    t.pre_tokenizer = Whitespace()
    t.save(str(d / "tokenizer.json"))
    return d


def _fifo(tmp: Path) -> Path:
    p = tmp / "out.fifo"
    os.mkfifo(p)
    return p


def _fifo_in_ckpt(name: str) -> Callable[[Path], Path]:
    """A checkpoint whose file `name` is a FIFO: a plain read of it would block forever."""
    def make(tmp: Path) -> Path:
        d = _ckpt(tmp, "ff-" + name.split(".")[0])
        (d / name).unlink()
        os.mkfifo(d / name)
        return d
    return make


def _tuned_fifo(tmp: Path) -> Path:
    d = tmp / "tuned-fifo"
    d.mkdir()
    os.mkfifo(d / "tuned.json")
    return d


def _symlink(tmp: Path) -> Path:
    (tmp / "victim.txt").write_text("keep me")
    p = tmp / "link.html"
    p.symlink_to(tmp / "victim.txt")
    return p


def _a_file(tmp: Path) -> Path:
    p = tmp / "plainfile"
    p.write_text("not a folder")
    return p


def _bench_json_corrupt(tmp: Path) -> Path:
    p = tmp / "bench.json"
    p.write_text('{"systems": {')
    return p


def _csv_text(tmp: Path) -> Path:
    p = tmp / "sweep.csv"
    p.write_text("mode,block_k,tok_per_s\ntargeted,1024,800.5\ngrid,1024,fast\n")
    return p


def _read_only(tmp: Path) -> Path:
    d = tmp / "ro"
    d.mkdir()
    d.chmod(0o555)
    return d


SETUPS: dict[str, Callable[[Path], object]] = {
    "csv_text": _csv_text,
    "read_only": _read_only,
    "ckpt": _ckpt,
    "ckpt_hidden_float": lambda t: _ckpt(t, "hf", {"hidden_size": 64.7}),
    "ckpt_hidden_str": lambda t: _ckpt(t, "hs", {"hidden_size": "64"}),
    "ckpt_eps_nan": lambda t: _ckpt(t, "en", {"rms_norm_eps": float("nan")}),
    "ckpt_eps_inf": lambda t: _ckpt(t, "ei", {"rms_norm_eps": float("inf")}),
    "ckpt_eps_zero": lambda t: _ckpt(t, "ez", {"rms_norm_eps": 0}),
    "ckpt_eps_neg": lambda t: _ckpt(t, "eg", {"rms_norm_eps": -1e-5}),
    "ckpt_theta_nan": lambda t: _ckpt(t, "tn", {"rope_theta": float("nan")}),
    "ckpt_arch_str": lambda t: _ckpt(t, "as", {"architectures": "LlamaForCausalLM"}),
    "ckpt_arch_num": lambda t: _ckpt(t, "an", {"architectures": [7]}),
    "ckpt_layers_bool": lambda t: _ckpt(t, "lb", {"num_hidden_layers": True}),
    "ckpt_eos_outside": lambda t: _ckpt(t, "eo", {"eos_token_id": 600}),
    "ckpt_eos_negative": lambda t: _ckpt(t, "en2", {"eos_token_id": [-1]}),
    "ckpt_maxpos_zero": lambda t: _ckpt(t, "mz", {"max_position_embeddings": 0}),
    "ckpt_no_vocab": lambda t: _ckpt(t, "nv", {"vocab_size": _DROP}),
    "ckpt_nan_weight": lambda t: _ckpt(t, "nw", tensor=("model.layers.1.mlp.up_proj.weight", 5, float("nan"))),
    "ckpt_inf_weight": lambda t: _ckpt(t, "iw", tensor=("model.norm.weight", 3, float("inf"))),
    "ckpt_nan_embed": lambda t: _ckpt(t, "ne", tensor=("model.embed_tokens.weight", 0, float("-inf"))),
    "ckpt_big_tokenizer": _with_tokenizer,
    "fifo": _fifo,
    "ckpt_fifo_config": _fifo_in_ckpt("config.json"),
    "ckpt_fifo_weights": _fifo_in_ckpt("model.safetensors"),
    "tuned_fifo": _tuned_fifo,
    "symlink": _symlink,
    "file": _a_file,
    "bench_json_corrupt": _bench_json_corrupt,
}


@dataclass
class Case:
    id: str
    argv: list[str] | None = None                  # kogtune/kogprobe argv; the first word picks the CLI
    call: Callable[[dict], object] | None = None   # or an API call (gets the setups' values)
    words: tuple[str, ...] = ()                     # substrings of the one error line
    code: int = 2
    after: Callable[[dict], bool] | None = None     # what must still hold afterwards (nothing clobbered)
    env: dict[str, str] = field(default_factory=dict)
    needs_non_root: bool = False                   # permissions do not stop root
    not_words: tuple[str, ...] = ()                 # substrings the line must not hold (a password)


def _search(*extra: str) -> list[str]:
    return ["kogtune", "search", "--backend", "sim", "--trials", "1", "--runs-dir", "{tmp}/runs", *extra]


def _gen(model: str, *extra: str) -> list[str]:
    return ["kogtune", "generate", "--model", model, "--mode", "reference", "--tokens", "1", "--json", *extra]


def _api_load(key: str) -> Callable[[dict], object]:
    def call(v):
        from kog.engine.weights import load_checkpoint
        return load_checkpoint(v[key])
    return call


def _reference_prefill(ids) -> Callable[[dict], object]:
    def call(v):
        from kog.engine.reference import Reference
        cfg = preset("tiny")
        return Reference(cfg, random_weights(cfg, "cpu", 0), 16).prefill(ids)
    return call


def _check_weights_nan(v):
    from kog.engine.weights import check_weights
    cfg = preset("tiny")
    w = random_weights(cfg, "cpu", 0)
    w["layers.0.wo"][1, 2] = float("nan")
    check_weights(cfg, w)


def _still_fifo(v) -> bool:
    return stat.S_ISFIFO(os.lstat(v["fifo"]).st_mode)


def _still_link(v) -> bool:
    return Path(v["symlink"]).is_symlink() and (Path(v["symlink"]).parent / "victim.txt").read_text() == "keep me"


CASES = [
    # ---- model config (config.json) ----------------------------------------------------------------
    Case("config-hidden-size-not-integer", _gen("{ckpt_hidden_float}"), words=("hidden_size", "integer", "64.7")),
    Case("config-hidden-size-string", _gen("{ckpt_hidden_str}"), words=("hidden_size", "integer")),
    Case("config-rms-norm-eps-nan", _gen("{ckpt_eps_nan}"), words=("rms_norm_eps", "finite")),
    Case("config-rms-norm-eps-inf", _gen("{ckpt_eps_inf}"), words=("rms_norm_eps", "finite")),
    Case("config-rms-norm-eps-zero", _gen("{ckpt_eps_zero}"), words=("rms_norm_eps", "> 0")),
    Case("config-rms-norm-eps-negative", _gen("{ckpt_eps_neg}"), words=("rms_norm_eps",)),
    Case("config-rope-theta-nan", _gen("{ckpt_theta_nan}"), words=("rope_theta",)),
    Case("config-architectures-a-string", _gen("{ckpt_arch_str}"), words=("architectures", "list")),
    Case("config-architectures-not-names", _gen("{ckpt_arch_num}"), words=("architectures",)),
    Case("config-num-layers-a-bool", _gen("{ckpt_layers_bool}"), words=("num_hidden_layers", "integer")),
    Case("config-eos-outside-vocab", _gen("{ckpt_eos_outside}"), words=("eos_token_id", "600", "vocabulary")),
    Case("config-eos-negative", _gen("{ckpt_eos_negative}"), words=("eos_token_id", "-1")),
    Case("config-max-position-zero", _gen("{ckpt_maxpos_zero}"), words=("max_position_embeddings",)),
    Case("config-vocab-missing", _gen("{ckpt_no_vocab}"), words=("vocab_size", "missing")),
    # ---- weights ----------------------------------------------------------------------------------------
    Case("weight-nan-in-checkpoint", _gen("{ckpt_nan_weight}"),
         words=("model.layers.1.mlp.up_proj.weight", "non-finite", "nan")),
    Case("weight-inf-in-checkpoint", _gen("{ckpt_inf_weight}"), words=("model.norm.weight", "inf")),
    Case("weight-inf-in-embedding", _gen("{ckpt_nan_embed}"), words=("model.embed_tokens.weight",)),
    Case("weight-nan-api-load", call=_api_load("ckpt_nan_weight"), words=("model.layers.1.mlp.up_proj.weight",)),
    Case("weight-nan-check-weights", call=_check_weights_nan, words=("layers.0.wo", "[1, 2]")),
    # ---- prompts and token ids --------------------------------------------------------------------------
    Case("prompt-id-negative", call=_reference_prefill([1, -1]), words=("id -1", "vocabulary")),
    Case("prompt-id-past-vocab", call=_reference_prefill([512]), words=("id 512", "[0, 512)")),
    Case("prompt-id-tensor-past-vocab", call=_reference_prefill(torch.tensor([3, 9999])), words=("9999",)),
    Case("prompt-id-not-integer", call=_reference_prefill([1.5]), words=("not an integer",)),
    Case("tokenizer-beyond-vocab", _gen("{ckpt_big_tokenizer}", "--prompt", "hello"),
         words=("tokenizer", "900", "vocabulary")),
    Case("prompt-not-utf8", _gen("tiny", "--prompt", "caf\udce9"), words=("--prompt", "UTF-8", "0xe9")),
    # ---- sampling arguments -----------------------------------------------------------------------------
    Case("temperature-nan", _gen("tiny", "--temperature", "nan"), words=("--temperature", "nan")),
    Case("temperature-inf", _gen("tiny", "--temperature", "inf"), words=("--temperature",)),
    Case("temperature-negative", _gen("tiny", "--temperature", "-1"), words=("--temperature",)),
    Case("top-p-nan", _gen("tiny", "--top-p", "nan"), words=("--top-p",)),
    Case("seed-2-to-70", _gen("tiny", "--seed", str(2 ** 70)), words=("--seed", str(2 ** 70))),
    Case("seed-negative", _gen("tiny", "--seed", "-1"), words=("--seed",)),
    Case("tokens-zero", _gen("tiny") + ["--tokens", "0"], words=("--tokens",)),
    # ---- output paths -----------------------------------------------------------------------------------
    Case("report-output-fifo", ["kogprobe", "report", "--bundled", "-o", "{fifo}"], words=("FIFO", "out.fifo"),
         after=_still_fifo),
    Case("report-output-symlink", ["kogprobe", "report", "--bundled", "-o", "{symlink}"], words=("symlink",),
         after=_still_link),
    Case("report-output-folder", ["kogtune", "report", "--bundled", "-o", "{ckpt}"], words=("folder",),
         after=lambda v: (Path(v["ckpt"]) / "config.json").is_file()),
    Case("report-output-under-a-file", ["kogprobe", "report", "--bundled", "-o", "{file}/r.html"],
         words=("cannot write",)),
    Case("bench-json-corrupt", ["kogtune", "report", "{bench_json_corrupt}", "-o", "{tmp}/r.html"],
         words=("bench JSON",)),
    Case("report-output-read-only-folder", ["kogprobe", "report", "--bundled", "-o", "{read_only}/r.html"],
         words=("cannot write", "ro"), needs_non_root=True),
    # ---- search arguments and storage -------------------------------------------------------------------
    Case("search-timeout-zero", _search("--timeout", "0"), words=("--timeout", "> 0")),
    Case("search-timeout-negative", _search("--timeout", "-1"), words=("--timeout",)),
    Case("search-timeout-nan", _search("--timeout", "nan"), words=("--timeout",)),
    Case("search-trials-zero", _search("--trials", "0"), words=("--trials",)),
    Case("search-workers-zero", _search("--workers", "0"), words=("--workers",)),
    Case("search-runs-dir-empty", ["kogtune", "search", "--backend", "sim", "--runs-dir", ""],
         words=("empty", "--runs-dir")),
    Case("search-runs-dir-a-file", ["kogtune", "search", "--backend", "sim", "--runs-dir", "{file}"],
         words=("plainfile", "not a folder")),
    Case("search-kog-runs-dir-a-file", ["kogtune", "search", "--backend", "sim"], env={"KOG_RUNS_DIR": "{tmp}/f"},
         words=("KOG_RUNS_DIR", "not a folder")),
    Case("runs-kog-runs-dir-a-file", ["kogprobe", "runs"], env={"KOG_RUNS_DIR": "{tmp}/f"},
         words=("KOG_RUNS_DIR", "not a folder")),
    Case("runs-dir-empty", ["kogprobe", "runs", "--runs-dir", ""], words=("empty",)),
    Case("search-storage-not-a-url", _search("--storage", "notaurl"), words=("storage", "notaurl")),
    Case("search-storage-unsupported", _search("--storage", "mongodb://x/y"), words=("storage", "mongodb")),
    Case("search-storage-missing-folder", _search("--storage", "sqlite:////nonexistent/dir/x.db"),
         words=("storage", "/nonexistent/dir")),
    Case("search-storage-sqlite-on-a-folder", _search("--storage", "sqlite:///{tmp}"), words=("storage",)),
    Case("search-storage-bad-password-hidden", _search("--storage", "postgresql://u:secret@127.0.0.1:1/db"),
         words=("storage", "127.0.0.1"), not_words=("secret",)),
    Case("search-unknown-model", _search("--model", "nope-7b"), words=("unknown model", "nope-7b")),
    Case("replay-text-in-tok-per-s", ["kogtune", "replay", "{csv_text}"], words=("row 2", "tok_per_s", "fast")),
    Case("replay-missing-file", ["kogtune", "replay", "{tmp}/none.parquet"], words=("no such sweep",)),
    # ---- inputs that are FIFOs: refused by name, never read (a read would block forever) -----------------
    Case("replay-fifo", ["kogtune", "replay", "{fifo}"], words=("sweep table", "FIFO"), after=_still_fifo),
    Case("config-json-fifo", _gen("{ckpt_fifo_config}"), words=("config", "FIFO")),
    Case("safetensors-fifo", _gen("{ckpt_fifo_weights}"), words=("safetensors", "FIFO")),
    Case("tuned-json-fifo", ["kogtune", "show"], env={"KOG_TUNED_DIR": "{tuned_fifo}"}, words=("tuned-config store", "FIFO")),
]


def _fill(s: str, values: dict) -> str:
    for k, v in values.items():
        s = s.replace("{" + k + "}", str(v))
    return s


def _needed(case: Case) -> list[str]:
    text = " ".join([*(case.argv or []), *case.env.values()]) + " " + getattr(case.call, "__qualname__", "")
    keys = [k for k in SETUPS if "{" + k + "}" in text]
    for cell in (case.call.__closure__ or ()) if case.call else ():
        if isinstance(cell.cell_contents, str) and cell.cell_contents in SETUPS:
            keys.append(cell.cell_contents)
    if case.after is not None:
        keys += [k for k in SETUPS if f'"{k}"' in _source(case.after)]
    return sorted(set(keys))


def _source(fn) -> str:
    import inspect
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case: Case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path / "tuned"))
    monkeypatch.setenv("KOG_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("KOG_DEBUG", raising=False)
    if case.needs_non_root and os.geteuid() == 0:
        pytest.skip("running as root: permissions do not apply")
    (tmp_path / "f").write_text("a file where a folder should be")
    values: dict = {"tmp": tmp_path}
    for k in _needed(case):
        values[k] = SETUPS[k](tmp_path)
    for k, v in case.env.items():
        monkeypatch.setenv(k, _fill(v, values))
    capsys.readouterr()
    if case.argv is not None:
        tool, *argv = [_fill(a, values) for a in case.argv]
        from kog.probe.cli import main as probe_main
        from kog.tune.cli import main as tune_main
        try:
            code = {"kogprobe": probe_main, "kogtune": tune_main}[tool](argv)
        except SystemExit as e:               # argparse
            code = e.code
        out, err = capsys.readouterr()
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("usage:")
                 and not ln.startswith(" ")]
        assert code == case.code, (code, err)
        assert "Traceback" not in err and "Traceback" not in out
        assert len(lines) == 1, err
        line = lines[0]
    else:
        from kog.errors import KogError
        with pytest.raises(KogError) as e:
            case.call(values)
        assert e.value.exit_code == case.code
        line = str(e.value)
        assert "\n" not in line
    for w in case.words:
        assert w.lower() in line.lower(), (w, line)
    for w in case.not_words:
        assert w not in line, (w, line)
    if case.after is not None:
        assert case.after(values), "something already there was changed"
