"""kog.Engine (engine/api.py) on the CPU: the request logic over a scripted backend (fast), the reference mode,
and the monokernel itself through Triton's interpreter on a tiny checkpoint (a few tokens each: the
interpreter takes seconds per token)."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch

import kog
from kog.engine import api
from kog.engine.api import Engine, StopStrings
from kog.engine.config import ConfigError, preset
from kog.engine.engine_config import EngineConfig
from kog.engine.reference import Reference
from kog.engine.tokenizer import BYTE_OFFSET, ByteTokenizer, StreamDecoder
from kog.engine.weights import random_weights, save_checkpoint

REPO = Path(__file__).resolve().parents[1]
# a small tiling for the tiny model: the interpreter's cost grows with the tile sizes it emulates
SMALL = EngineConfig(block_k=64, bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=64, attn_block=16,
                     sync_rows=32)


def byte_ids(text: str) -> list[int]:
    """What the tiny preset's byte tokenizer gives for `text` (no BOS)."""
    return [b + BYTE_OFFSET for b in text.encode()]


class ScriptedMonokernel:
    """Stands in for Monokernel with the streaming interface: yields a script of token ids (or, without one,
    ids drawn from random.Random(seed)), stopping after n or at an id of its stop table, as the kernel does."""
    built = 0
    script: list[int] | None = None

    def __init__(self, cfg, weights, ecfg, device, max_seq=None):
        type(self).built += 1
        self.cfg, self.ecfg, self.max_seq = cfg, ecfg, max_seq
        self.stop_ids = list(cfg.eos_token_id)
        self.compile_seconds = 1.25
        self.calls: list[dict] = []

    def set_stop_ids(self, ids):
        assert len(ids) <= 8
        self.stop_ids = list(ids)

    def stream(self, prompt_ids, n, temperature=0.0, top_k=0, top_p=1.0, seed=0):
        self.calls.append(dict(prompt=list(prompt_ids), n=n, temperature=temperature, top_k=top_k, top_p=top_p,
                               seed=seed))
        assert len(prompt_ids) - 1 + n <= self.max_seq
        rng = random.Random(seed)
        script = self.script or [rng.randrange(BYTE_OFFSET + 97, BYTE_OFFSET + 123) for _ in range(n)]
        out = 0
        for t in script[:n]:
            out += 1
            yield t
            if t in self.stop_ids:
                break
        self.last_stream = dict(ttft_s=1e-3, decode_s=2e-3 * out, tokens=out)


@pytest.fixture
def scripted(monkeypatch):
    """Engine.from_pretrained("tiny") over ScriptedMonokernel; returns a builder taking a script."""
    import kog.engine.monokernel as M
    monkeypatch.setattr(M, "Monokernel", ScriptedMonokernel)
    monkeypatch.setattr(ScriptedMonokernel, "built", 0)

    def make(script=None, **kw):
        monkeypatch.setattr(ScriptedMonokernel, "script", script)
        return Engine.from_pretrained("tiny", device="cpu", config=SMALL, **kw)
    return make


def write_byte_tokenizer(d: Path) -> None:
    """A byte-level BPE tokenizer.json with the preset's byte ids (byte b -> id b + 3; 0..2 special)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    char = {b: chr(b if b in printable else next(shifted)) for b in range(256)}    # GPT-2's bytes_to_unicode
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{char[b]: b + BYTE_OFFSET for b in range(256)}}
    t = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.save(str(d / "tokenizer.json"))


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    """A tiny Llama checkpoint directory (float32 on disk) with a byte-level tokenizer.json."""
    cfg = preset("tiny").replace(dtype="float32")
    d = save_checkpoint(cfg, random_weights(cfg, "cpu", 0), tmp_path_factory.mktemp("ckpt") / "tiny-llama")
    write_byte_tokenizer(d)
    return d


# ---- the request logic over a scripted backend ------------------------------------------------------------------

def test_generate_and_stream_agree(scripted):
    eng = scripted()
    r = eng.generate("hi", max_new_tokens=12, temperature=0.7, top_p=0.9, seed=5)
    assert r.stop_reason == "length" and len(r.token_ids) == 12 and r.seed == 5
    assert r.prompt_ids == [1, *byte_ids("hi")] and r.text == ByteTokenizer(eng.cfg).decode(r.token_ids)
    assert r.compile_seconds == 1.25 and r.tok_per_s == pytest.approx(12 / 0.024) and 0 < r.ttft_s <= r.seconds
    assert eng.backend.calls[-1] == dict(prompt=r.prompt_ids, n=12, temperature=0.7, top_k=0, top_p=0.9, seed=5)
    pieces = list(eng.stream("hi", max_new_tokens=12, temperature=0.7, top_p=0.9, seed=5))
    assert [p.token_id for p in pieces] == r.token_ids and "".join(p.text for p in pieces) == r.text
    assert eng.last_result.token_ids == r.token_ids


def test_seed_none_draws_a_fresh_seed_and_records_it(scripted):
    eng = scripted()
    a, b = eng.generate([1, 50], 6, temperature=1.0), eng.generate([1, 50], 6, temperature=1.0)
    assert a.seed != b.seed and 0 <= a.seed < 2 ** 31
    assert eng.generate([1, 50], 6, temperature=1.0, seed=a.seed).token_ids == a.token_ids


def test_stop_ids_go_to_the_kernel_and_end_the_text(scripted):
    eng = scripted(script=byte_ids("ab\ncd") + [2])
    r = eng.generate("x", 20, stop=byte_ids("\n"))
    assert eng.backend.stop_ids == [2, *byte_ids("\n")]          # the EOS ids first, then the caller's
    assert r.stop_reason == "stop_id" and r.stop == byte_ids("\n")[0]
    assert r.token_ids == byte_ids("ab\n") and r.text == "ab"       # the stop id is generated, not shown
    r = eng.generate("x", 20)
    assert eng.backend.stop_ids == [2]                                # each request sets its own table
    assert r.stop_reason == "eos" and r.token_ids[-1] == 2 and r.text == "ab\ncd"
    with pytest.raises(ConfigError, match="stop table holds 8"):
        eng.generate("x", 4, stop=list(range(10, 18)))


def test_stop_strings_end_the_output_and_never_show(scripted):
    eng = scripted(script=byte_ids("Hello, STOP here"))
    pieces = list(eng.stream("x", 30, stop=["STOP", "zzz"]))
    r = eng.last_result
    assert r.text == "Hello, " and r.stop_reason == "stop_string" and r.stop == "STOP"
    assert "".join(p.text for p in pieces) == "Hello, " and not any("S" in p.text for p in pieces)
    assert r.token_ids == byte_ids("Hello, STOP")                   # the launch's output up to the match
    # a stop string's start that never completes is released at the end
    eng = scripted(script=byte_ids("Hello, ST"))
    pieces = list(eng.stream("x", 30, stop="STOP"))
    assert eng.last_result.text == "Hello, ST" and eng.last_result.stop_reason == "length"
    assert pieces[-1].token_id is None and pieces[-1].text == "ST"


def test_stop_strings_unit():
    s = StopStrings(["</s>", "\n\n"])
    assert [s.push(x) for x in ["ab<", "/", "x", "\n", "\n", "tail"]] == ["ab", "", "</x", "", "", ""]
    assert s.hit == "\n\n"
    s = StopStrings(["abc"])
    assert s.push("xab") == "x" and s.flush() == "ab" and s.hit is None
    assert StopStrings([]).push("anything") == "anything"


def test_stream_never_splits_a_character(scripted):
    text = "héllo ✓ wörld 🙂"
    eng = scripted(script=byte_ids(text))
    pieces = list(eng.stream("x", 40))
    assert "".join(p.text for p in pieces) == text and not any("\ufffd" in p.text for p in pieces)
    assert sum(1 for p in pieces if p.text == "") == len(text.encode()) - len(text)   # continuation bytes


def test_stream_decoder_window_matches_full_decode():
    """The windowed decode gives the text a full decode gives, for random byte streams (invalid UTF-8 too)."""
    tok = ByteTokenizer(preset("tiny"))
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.choice([rng.randrange(3, 131), rng.randrange(195, 247), rng.randrange(131, 195)])
               for _ in range(rng.randrange(1, 40))]
        d = StreamDecoder(tok)
        assert "".join(d.push(i) for i in ids) + d.flush() == tok.decode(ids)


def test_longer_request_reuses_the_one_backend(scripted):
    eng = scripted()
    mk = eng.backend
    assert eng.max_seq == 256                     # tiny's max_position_embeddings (< the 4096 cap)
    eng.generate([1, 2, 3], 4)
    eng.generate([1, 2, 3], 200)
    eng.generate(list(range(1, 200)), 58)         # 199 + 58 - 1 = 256 positions: exactly the cache
    assert eng.backend is mk and ScriptedMonokernel.built == 1
    with pytest.raises(ConfigError, match=r"max_seq 256") as e:
        eng.generate(list(range(1, 200)), 59)
    assert "\n" not in str(e.value)
    assert scripted(max_seq=64).backend.max_seq == 64
    with pytest.raises(ConfigError, match="max_seq 999"):
        scripted(max_seq=999)


def test_config_reaches_the_kernel(scripted):
    eng = scripted(mode="grid")
    assert eng.backend.ecfg == SMALL.replace(mode="grid")
    seen = []
    import kog.engine.monokernel as M
    eng = Engine(eng.cfg, random_weights(eng.cfg, "cpu", 0), ByteTokenizer(eng.cfg),
                 config=lambda m, span: seen.append(span) or SMALL, max_seq=100)
    assert seen == [100] and isinstance(eng.backend, M.Monokernel)


@pytest.mark.parametrize("kw, match", [
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(temperature=-1), "temperature"),
    (dict(top_k=-2), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(stop=[3.5]), "stop takes"), (dict(stop=[10_000]), "outside the vocabulary"),
])
def test_bad_requests_are_one_line(scripted, kw, match):
    eng = scripted()
    with pytest.raises(ConfigError, match=match):
        eng.stream([1, 2], **kw)            # refused when called, before any token
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        eng.generate([1, 512], 2)
    with pytest.raises(ConfigError, match="empty"):
        eng.generate([], 2)


# ---- models, tokenizers, the Hub cache --------------------------------------------------------------------------

def test_missing_tokenizer_refuses_text_and_runs_ids(tmp_path):
    cfg = preset("tiny").replace(dtype="float32")
    d = save_checkpoint(cfg, random_weights(cfg, "cpu", 0), tmp_path / "ck")
    eng = Engine.from_pretrained(d, device="cpu", mode="reference", dtype=torch.float32)
    assert not eng.random_weights and eng.tokenizer.kind == "none"
    with pytest.raises(ConfigError, match=r"no tokenizer\.json: give token ids") as e:
        eng.generate("hello", 4)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="tokenizer.json"):
        eng.generate([1, 2], 4, stop="x")
    r = eng.generate([1, 40, 41], 4)
    assert r.text is None and r.token_ids == Reference(cfg, random_weights(cfg, "cpu", 0), 32).greedy([1, 40, 41], 4)


def test_unknown_model_is_one_line():
    with pytest.raises(ConfigError, match=r"unknown model 'gpt-17': not a preset \(llama-3.2-1b") as e:
        Engine.from_pretrained("gpt-17", device="cpu")
    assert "Hugging Face" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="mode"):
        Engine.from_pretrained("tiny", device="cpu", mode="fast")


def _hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_hub_id_not_in_the_cache_is_one_line(tmp_path, monkeypatch):
    _hub_cache(tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match=r"'acme/tiny-llama'.*not in the local Hugging Face cache.*"
                                          r"huggingface-cli download acme/tiny-llama") as e:
        Engine.from_pretrained("acme/tiny-llama", device="cpu", mode="reference")
    assert "\n" not in str(e.value)


def test_hub_id_resolves_offline_from_the_cache(tmp_path, monkeypatch, tiny_ckpt):
    """A snapshot laid out as huggingface_hub caches one (refs/main -> snapshots/<commit>) loads with its
    tokenizer; nothing is fetched."""
    import shutil
    cache = _hub_cache(tmp_path, monkeypatch)
    repo = cache / "models--acme--tiny-llama"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(tiny_ckpt, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    eng = Engine.from_pretrained("acme/tiny-llama", device="cpu", mode="reference", dtype=torch.float32)
    assert eng.tokenizer.kind == "tokenizer.json" and eng.name == "acme/tiny-llama"
    assert eng.encode("hi") == byte_ids("hi")


def test_presets_say_their_weights_are_random():
    eng = Engine.from_pretrained("tiny", device="cpu", mode="reference")
    assert eng.random_weights and eng.tokenizer.kind == "bytes"


# ---- the reference mode -------------------------------------------------------------------------------------------

def test_reference_mode_samples_and_stops():
    cfg = preset("tiny")
    eng = Engine.from_pretrained("tiny", device="cpu", mode="reference")
    w = random_weights(cfg, "cpu", 0)
    prompt = [1, 40, 41, 42]
    greedy = eng.generate(prompt, 8)
    assert greedy.token_ids == Reference(cfg, w, 64).greedy(prompt, 8) and eng.config is None
    a = eng.generate(prompt, 8, temperature=1.0, top_k=20, seed=7)
    b = eng.generate(prompt, 8, temperature=1.0, top_k=20, seed=7)
    c = eng.generate(prompt, 8, temperature=1.0, top_p=0.9, seed=8)
    assert a.token_ids == b.token_ids != c.token_ids
    stop = greedy.token_ids[3]
    r = eng.generate(prompt, 8, stop=stop)
    assert r.token_ids == greedy.token_ids[:greedy.token_ids.index(stop) + 1] and r.stop_reason == "stop_id"


# ---- the monokernel through the interpreter -------------------------------------------------------------------

def test_monokernel_engine_on_a_checkpoint(tiny_ckpt):
    """Greedy tokens equal the float32 oracle's; the same seed samples the same tokens; a longer request
    runs on the same Monokernel, its packed weights untouched; a stop id ends it."""
    from kog.engine.monokernel import Monokernel
    eng = Engine.from_pretrained(tiny_ckpt, device="cpu", config=SMALL, dtype=torch.float32)
    mk, wbuf = eng.backend, eng.backend.wbuf.data_ptr()
    assert isinstance(mk, Monokernel) and mk.max_seq == 256 and eng.config == SMALL
    prompt = eng.encode("hi")
    oracle = Reference(eng.cfg, mk.ref.w, 64, compute_dtype=torch.float32).greedy(prompt, 4)
    r = eng.generate("hi", 2)
    assert r.token_ids == oracle[:2] and r.prompt_ids == prompt
    assert r.text == eng.tokenizer.decode(oracle[:2]) and r.stop_reason == "length"
    r = eng.generate("hi", 4, stop=oracle[1])
    assert r.token_ids == oracle[:oracle.index(oracle[1]) + 1] and r.stop_reason == "stop_id"
    s1 = eng.generate("hi", 3, temperature=5.0, top_k=50, seed=11)
    s2 = eng.generate("hi", 3, temperature=5.0, top_k=50, seed=11)
    assert s1.token_ids == s2.token_ids and s1.seed == 11
    assert eng.backend is mk and mk.wbuf.data_ptr() == wbuf


def test_readme_example_runs_as_written(tiny_ckpt, monkeypatch, capsys):
    """The README's Python example, with its model id pointed at the tiny checkpoint (the interpreter runs the
    tiny model's small tiling in place of the platform default, which the interpreter emulates slowly)."""
    import kog.engine.monokernel as M
    block = re.search(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block, "README has no ```python example"
    code = block.group(1)
    assert len(code.strip().splitlines()) <= 5
    model = re.search(r'from_pretrained\("([^"]+)"', code).group(1)
    monkeypatch.setattr(M, "platform_default", lambda cfg, device=None, span=None: SMALL)
    exec(compile(code.replace(model, str(tiny_ckpt)), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "tok/s" in out


def test_kog_engine_is_the_api():
    assert kog.Engine is Engine and api.Engine is Engine


# ---- kogtune generate over the Engine -----------------------------------------------------------------------------

def _capture_engines(monkeypatch) -> list:
    made = []
    build = Engine.from_pretrained.__func__

    def capture(cls, *a, **kw):
        made.append(build(cls, *a, **kw))
        return made[-1]
    monkeypatch.setattr(Engine, "from_pretrained", classmethod(capture))
    return made


def _store_small_config(tmp_path, monkeypatch):
    """SMALL as this machine's tuned config for the tiny model (kog.tune.store, device "cpu")."""
    from kog.tune import store
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path / "tuned"))
    assert store.save_best("cpu", preset("tiny"), SMALL, 1.0, {"backend": "gpu"})


def test_cli_passes_sampling_stops_and_the_tuned_config(scripted, tmp_path, monkeypatch, capsys):
    from kog.tune.cli import main as kogtune
    _store_small_config(tmp_path, monkeypatch)
    made = _capture_engines(monkeypatch)
    monkeypatch.setattr(ScriptedMonokernel, "script", byte_ids("one two\n\nthree"))
    rc = kogtune(["generate", "--model", "tiny", "--mode", "grid", "--prompt", "hi", "--tokens", "20",
                  "--temperature", "0.8", "--top-k", "40", "--top-p", "0.9", "--seed", "3", "--stop", "\n\n",
                  "--stop-id", "7", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    eng = made[0]
    assert eng.config == SMALL.replace(mode="grid") and eng.backend.stop_ids == [2, 7]
    assert eng.backend.calls == [dict(prompt=[1, *byte_ids("hi")], n=20, temperature=0.8, top_k=40, top_p=0.9,
                                      seed=3)]
    assert out["text"] == "one two" and out["stop_reason"] == "stop_string" and out["seed"] == 3
    assert out["tokens"] == byte_ids("one two\n\n") and out["compile_seconds"] == 1.25
    assert {"tok_per_s", "ttft_s", "prompt_ids", "tokenizer", "mode"} <= set(out)


def test_cli_streams_the_monokernel_with_sampling(tmp_path, monkeypatch, capsys):
    """`kogtune generate --mode targeted --temperature 0.8 --top-p 0.9` through the interpreter: the prompt,
    then the streamed text, then one status line naming the seed and that a preset's weights are random."""
    from kog.tune.cli import main as kogtune
    _store_small_config(tmp_path, monkeypatch)
    assert kogtune(["generate", "--model", "tiny", "--mode", "targeted", "--prompt", "hi", "--tokens", "2",
                    "--temperature", "0.8", "--top-p", "0.9", "--seed", "9"]) == 0
    cap = capsys.readouterr()
    assert cap.out.startswith("hi") and cap.out.endswith("\n")
    assert re.search(r"2 tokens, [\d.]+ tok/s, first token \d+ ms.*seed 9, mode targeted, tiny \(random weights",
                     cap.err)


def test_cli_text_prompt_without_tokenizer_is_one_line(tmp_path, capsys):
    from kog.tune.cli import main as kogtune
    cfg = preset("tiny")
    d = save_checkpoint(cfg, random_weights(cfg, "cpu", 0), tmp_path / "ck")
    assert kogtune(["generate", "--model", str(d), "--mode", "reference", "--tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no tokenizer.json" in err and "\n" not in err and "Traceback" not in err
    assert kogtune(["generate", "--model", "tiny", "--mode", "reference", "--tokens", "300", "--max-seq", "64"]) == 2
    assert "max_seq 64" in capsys.readouterr().err
