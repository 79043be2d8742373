"""Device script: the same engine config from two source trees, same run, in alternating processes.

A kernel change has no switch to flip inside one process, so this runs each tree's kog in its own process:
for each preset, ROUNDS rounds of (tree A, tree B, ...), each process building the engine on the same random
bf16 weights (seed 0) and the rule's config (kog.tune.store.tuned_config), one warm-up launch, then LAUNCHES
timed launches (tok/s = new tokens / the launch's seconds). A tree's first process also checks it: the
teacher-forced error over 32 tokens against the float32 reference (the bf16 weights upcast) and the first
greedy divergence from the bf16 reference. The limit = the first process's copy rate (read + written) /
weight bytes a token. Compiled kernels come from Triton's cache after each tree's first process.

python3 bench/ab_trees.py OUT.json --tree base=DIR|TAR --tree new=DIR|TAR [--presets llama-3.2-1b ...]
    [--mode targeted|grid] [--rounds 3] [--max-seq 384] [--override NAME='{"attn_block": 32}']
    [--prompt-tokens 64] [--new-tokens 256]
--prompt-tokens / --new-tokens: the timed launches' protocol (the bench's by default; kogtune's trials: 16, 128).
--override changes EngineConfig fields of one tree's config (the rule's, then these): the same tree may run
twice under two names, one with the override. A tree DIR holds an importable `kog` package (e.g. what
bench/device_env.sh links); a TAR (`git archive REV core probe tune engine reports > main.tar`, carried to the
device) is unpacked and linked the same way under /tmp. Writes OUT.json after every process (a timeout keeps
what ran). KOG_GIT_COMMIT names the commit of the tree run from this checkout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# the bench's protocol (--prompt-tokens, --new-tokens) and --max-seq's default
PROMPT_TOKENS, NEW, MAX_SEQ, CHECK, LAUNCHES = 64, 256, 384, 32, 2


def worker(preset: str, mode: str, check: bool, override: dict | None = None, max_seq: int = MAX_SEQ,
           prompt_tokens: int = PROMPT_TOKENS, new: int = NEW) -> dict:
    """One process's measurement of the tree on PYTHONPATH (run with --worker)."""
    import torch

    from kog.engine.config import PRESETS
    from kog.engine.monokernel import Monokernel
    from kog.engine.reference import Reference
    from kog.engine.weights import random_weights
    from kog.tune.bench import copy_bandwidth_GBps, first_divergence, max_rel_err, reference_fp32_logits
    from kog.tune.store import tuned_config

    dev = torch.device("cuda")
    PROMPT = list(range(100, 100 + prompt_tokens))
    cfg = PRESETS[preset].replace(eos_token_id=())
    w = random_weights(cfg, "cuda", seed=0, dtype=torch.bfloat16)
    out: dict = {}
    if check:
        ref = Reference(cfg, w, max_seq)
        tokens = ref.greedy(PROMPT, CHECK)
        del ref
        fp32 = reference_fp32_logits(cfg, w, PROMPT, tokens)
        torch.cuda.empty_cache()
        out["copy_GBps"] = copy_bandwidth_GBps(dev)
        out["weight_bytes_per_token"] = cfg.weight_bytes_per_token()
    ecfg = tuned_config(cfg, dev, max_seq).replace(mode=mode, **(override or {}))
    mk = Monokernel(cfg, w, ecfg, dev, max_seq=max_seq)
    mk.n_eos = 0
    if check:
        logits = mk.teacher_forced_logits(PROMPT, tokens)
        toks, _ = mk.generate(PROMPT, CHECK)
        out["rel_err_vs_fp32_ref"] = max_rel_err(logits, fp32)
        out["first_divergence_vs_bf16_ref"] = first_divergence(toks, tokens)
    mk.generate(PROMPT, new)              # warm-up: the launch length's specialization, first touch
    out["tok_per_s"] = [new / mk.generate(PROMPT, new)[1] for _ in range(LAUNCHES)]
    out["regs"], out["spills"] = mk.kernel_regs, mk.kernel_spills
    out["config"] = ecfg.to_dict()
    return out


def _run_worker(tree: str, preset: str, mode: str, check: bool, timeout_s: float, override: dict | None = None,
                max_seq: int = MAX_SEQ, prompt_tokens: int = PROMPT_TOKENS, new: int = NEW) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", preset, "--mode", mode] + (["--check"] if check
                                                                                           else [])
    cmd += ["--max-seq", str(max_seq), "--prompt-tokens", str(prompt_tokens), "--new-tokens", str(new)]
    if override:
        cmd += ["--config-json", json.dumps(override)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": f"exit {p.returncode}: {p.stderr.strip()[-1500:]}"}
    return json.loads(lines[-1])


PACKAGES = ("probe", "tune", "engine", "reports")


def tree_dir(name: str, spec: str, work: str) -> str:
    """The directory holding tree `name`'s importable `kog`: `spec` itself, or for a .tar of the repository's
    core/ and PACKAGES (git archive) its contents unpacked under work/name and linked as bench/device_env.sh
    links a checkout (core/ as the package, the others as its subpackages)."""
    if not spec.endswith(".tar"):
        return spec
    import shutil
    import tarfile
    src, root = os.path.join(work, name, "src"), os.path.join(work, name, "path")
    shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    try:
        with tarfile.open(spec) as tf:
            tf.extractall(src, filter="data")
    except (OSError, tarfile.TarError) as e:
        raise SystemExit(f"--tree {name}={spec}: not a readable tar archive ({e})")
    if not os.path.isdir(os.path.join(src, "core")):
        raise SystemExit(f"--tree {name}={spec}: no core/ in the archive (want git archive REV core "
                         f"{' '.join(PACKAGES)})")
    pkg = os.path.join(root, "kog")
    os.makedirs(pkg)
    for f in os.listdir(os.path.join(src, "core")):
        os.symlink(os.path.join(src, "core", f), os.path.join(pkg, f))
    for p in PACKAGES:
        os.symlink(os.path.join(src, p), os.path.join(pkg, p))
    return root


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Per tree: the median tok/s over every timed launch of every round, its min and max, the check."""
    out = {}
    for name, rs in runs.items():
        rates = [r for x in rs for r in x.get("tok_per_s", [])]
        first = rs[0] if rs else {}
        out[name] = {"tok_per_s": statistics.median(rates) if rates else None, "min": min(rates, default=None),
                     "max": max(rates, default=None), "n": len(rates), "regs": first.get("regs"),
                     "rel_err_vs_fp32_ref": first.get("rel_err_vs_fp32_ref"),
                     "first_divergence_vs_bf16_ref": first.get("first_divergence_vs_bf16_ref"),
                     "errors": [x["error"] for x in rs if "error" in x]}
    return out


def _save(path: str, doc: dict) -> None:
    """The document so far, replaced atomically: a timeout mid-write leaves the previous one, not half a file."""
    from kog.fsutil import atomic_write_text
    atomic_write_text(path, json.dumps(doc, indent=1, default=str))


def _parse_overrides(items: list[str], trees: dict, ap: argparse.ArgumentParser) -> dict[str, dict]:
    """NAME=JSON items as {name: fields}; an unknown tree name or JSON that is not an object is a usage error."""
    out = {}
    for it in items:
        name, _, text = it.partition("=")
        try:
            fields = json.loads(text)
        except ValueError:
            fields = None
        if name not in trees or not isinstance(fields, dict):
            ap.error(f"--override {it!r}: want NAME=JSON object, NAME one of {sorted(trees)}")
        out[name] = fields
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--tree", action="append", default=[], help="NAME=DIR (repeat; the first is the baseline)")
    ap.add_argument("--presets", nargs="+", default=["llama-3.2-1b"])
    ap.add_argument("--mode", default="targeted")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one process may take")
    ap.add_argument("--override", action="append", default=[],
                    help="NAME=JSON: EngineConfig fields for that tree (repeat)")
    ap.add_argument("--max-seq", type=int, default=MAX_SEQ, help="cache positions (the attention splits)")
    ap.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS)
    ap.add_argument("--new-tokens", type=int, default=NEW)
    ap.add_argument("--config-json", default="")
    ap.add_argument("--worker")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    if a.worker:
        override = json.loads(a.config_json) if a.config_json else None
        print(json.dumps(worker(a.worker, a.mode, a.check, override, a.max_seq, a.prompt_tokens, a.new_tokens),
                         default=str), flush=True)
        return
    if not a.out or len(a.tree) < 2 or any("=" not in t for t in a.tree):
        ap.error("give OUT.json and at least two --tree NAME=DIR")
    if min(a.prompt_tokens, a.new_tokens) < 1 or a.max_seq < a.prompt_tokens + max(a.new_tokens, CHECK):
        ap.error(f"--max-seq {a.max_seq} holds fewer than the {a.prompt_tokens + max(a.new_tokens, CHECK)} "
                 f"positions a run writes (or a token count < 1)")
    specs = dict(t.split("=", 1) for t in a.tree)
    trees = {n: tree_dir(n, spec, "/tmp/kog-ab-trees") for n, spec in specs.items()}
    base = next(iter(trees))
    overrides = _parse_overrides(a.override, trees, ap)
    from kog.provenance import package_versions
    doc = {"git_commit": os.environ.get("KOG_GIT_COMMIT"), "versions": package_versions(), "trees": specs,
           "overrides": overrides,
           "mode": a.mode, "rounds": a.rounds,
           "launches_per_process": LAUNCHES, "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens,
           "max_seq": a.max_seq,
           "date": time.strftime("%Y-%m-%d"), "presets": {}}
    try:
        import torch
        doc["device"] = torch.cuda.get_device_name()
    except Exception as e:                  # recorded, not fatal: the workers report their own failure
        doc["device"] = f"unknown ({e!r})"
    for preset in a.presets:
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        entry = doc["presets"][preset] = {}
        for r in range(a.rounds):
            for name, tree in trees.items():
                runs[name].append(_run_worker(tree, preset, a.mode, r == 0, a.timeout, overrides.get(name),
                                              a.max_seq, a.prompt_tokens, a.new_tokens))
                entry.update(runs=runs, summary=summarize(runs))
                first = runs[base][0]
                if "copy_GBps" in first:
                    entry["limit_tok_per_s"] = first["copy_GBps"] * 1e9 / first["weight_bytes_per_token"]
                _save(a.out, doc)
        s = entry["summary"]
        ratios = {n: s[n]["tok_per_s"] / s[base]["tok_per_s"] for n in s
                  if s[n]["tok_per_s"] and s[base]["tok_per_s"]}
        entry["over_" + base] = ratios
        _save(a.out, doc)
        print(preset, {n: (round(s[n]["tok_per_s"] or 0, 1), s[n]["rel_err_vs_fp32_ref"], s[n]["errors"][:1])
                       for n in s}, {n: round(v, 4) for n, v in ratios.items()}, flush=True)


if __name__ == "__main__":
    main()
