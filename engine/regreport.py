"""Register report of the monokernel, compiled for sm_90 on a machine WITHOUT a GPU.

    python -m kog.engine.regreport --model llama-3.2-1b [--base sm90|plain] [--set ctas_per_sm=4] [--maxnreg N]
        [--json] [--sass]

By default the config is the one the engine runs on an sm_90 GPU with no tuned config stored (sm90_default for
the model and the cache); --set changes fields of it.

The monokernel's speed on the H200 is decided by register pressure (255 registers/thread -> 2 CTAs/SM;
a 128-register cap for 4 CTAs/SM spills). GPU time is scarce, so this compiles the kernel exactly as the
launcher would (same constexprs, same argument types and Triton specializations, same options) with
Triton's own compiler for GPUTarget("cuda", 90, 32), and reads the resources off the ptxas it ships:

  registers/thread, spill stores/loads and stack frame (ptxas -v), Triton's shared memory, the CTAs per SM
  that allows for the config's num_warps (H100/H200 limits), compile seconds; with --sass the counts of
  128-bit vs narrower global loads and of local-memory (LDL/STL) instructions in the SASS, and the shared
  loads of each GEMV chunk block (two variants whose chunk blocks differ stream differently); with --exposed
  the global loads whose result is read within a few instructions, by source line (a table read after an
  acquire is an L2 round trip: where such a load feeds an address or a branch, the warp waits for it).

`triton_n_spills` is what Triton's CompiledKernel.n_spills (and the bench JSON's "spills") reports on a
GPU: the driver's local memory bytes per thread / 4, i.e. the stack frame / 4.

Nothing here launches anything; the compile needs TRITON_INTERPRET unset (the CLI re-runs itself in a
subprocess without it when it is set, as tests/conftest.py does).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kog.engine.config import ModelConfig
from kog.engine.engine_config import EngineConfig, sm90_default
from kog.errors import KogError, UsageError, cli_entry
from kog.fsutil import atomic_write_bytes, atomic_write_text

PROG = "python -m kog.engine.regreport"

# Hopper (sm_90) per-SM limits, CUDA occupancy rules
REGS_PER_SM = 65536
REG_ALLOC_UNIT = 256            # registers are allocated per warp in units of 256
MAX_REGS_PER_THREAD = 255
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED_PER_CTA = 1024    # the driver reserves 1 KiB of shared memory per CTA
THREADS_PER_SM = 2048
MAX_CTAS_PER_SM = 32
H200_SMS = 132


# ---- the launcher's signature, without weights ----------------------------------------------------------

def cache_span(cfg: ModelConfig, max_seq: int | None, prompt_len: int, tokens: int) -> tuple[int, int]:
    """(KV cache positions, positions attention covers): max_seq, by default the prompt and the tokens plus one
    (at least 64, as `kogtune bench`); the span, at most the model's sliding window."""
    if max_seq is None:
        max_seq = max(prompt_len + tokens + 1, 64)
    return max_seq, cfg.attention_span(max_seq)


def launch_spec(cfg: ModelConfig, ecfg: EngineConfig, *, sms: int = H200_SMS, vendor: int = 1,
                prompt_len: int = 64, tokens: int = 512, max_seq: int | None = None, n_eos: int = 0,
                temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                trace: bool = False, trace_tokens: int = 8, write_logits: bool = False,
                forced: bool = False, attn_stamps: bool = False) -> tuple[tuple, dict[str, Any]]:
    """(args, launch options) exactly as Monokernel._launch_args builds them for one launch, every tensor
    replaced by a triton MockTensor of the same dtype (the launcher's tensors are fresh allocations: 16-byte
    aligned), through the launcher's own kernel_groups and kernel_constants.

    The defaults are the `kogtune bench` decode launch: 64-token prompt, 512 greedy tokens, max_seq = prompt +
    tokens + 1, EOS ignored (n_eos 0), not traced, no logits written. Integer values matter: Triton specializes
    an int equal to 1 into a constexpr and marks multiples of 16 (tests/test_regreport.py compares the two
    argument lists on the tiny preset)."""
    from types import SimpleNamespace

    import torch
    from triton.runtime.jit import MockTensor

    from kog.engine.kernel.sampling import sample_mode
    from kog.engine.monokernel import kernel_constants, kernel_groups
    from kog.engine.plan import make_plan

    e = ecfg
    if vendor == 0:                           # what the launcher does under TRITON_INTERPRET
        sms, e = 1, e.replace(ctas_per_sm=1)
    dt = getattr(torch, cfg.dtype if cfg.dtype in ("bfloat16", "float16") else "bfloat16")
    f32, i32, i64 = (MockTensor(torch.float32), MockTensor(torch.int32), MockTensor(torch.int64))
    max_seq, span = cache_span(cfg, max_seq, prompt_len, tokens)
    e, attn_splits = e.attn_layout(span)
    p = make_plan(cfg, e, sms, None, attn_splits)
    # Monokernel._pack: the small fp32 buffer's layout decides fnorm_off
    so = 64
    for _ in range(cfg.num_layers):
        sizes = ([cfg.qkv_size] if cfg.attention_bias else []) + \
                ([cfg.head_dim, cfg.head_dim] if cfg.qk_norm else []) + [cfg.hidden_size, cfg.hidden_size]
        for n in sizes:
            so += n
            so += (-so) % 16
    trace_cap = max(int(x) for x in (p.cta_start[1:] - p.cta_start[:-1])) * max(trace_tokens, 1)
    ring = bool(e.weight_ring)
    b = SimpleNamespace(
        wbuf=MockTensor(dt), woff=i64, small=f32, soff=i64, embed=MockTensor(dt), cos=f32, sin=f32,
        cache=MockTensor(dt), act=f32, part=f32, qkvt=i64, logits=f32, partial_v=f32, partial_i=i32,
        search=i64,
        out=i32, forced=i32, eos=i32, rows=i32, cta_start=i32, rpc=i32, target=i32, cnt=i32, smid_tab=i32,
        ring_lo=i32 if ring else None, ring_sz=i32 if ring else None, gring=MockTensor(dt) if ring else None,
        grow=i32 if ring else None, peers=None, sync=i32, err=i32, trace=i64, trace_tokens=trace_tokens,
        trace_cap=trace_cap, atr=i64, atr_cap=trace_cap if attn_stamps else 1, max_seq=max_seq, fnorm_off=so,
        attn_splits=attn_splits)
    run = (prompt_len - 1, tokens, 1 if forced else 0, int(seed), int(top_k),
           1.0 / temperature if temperature > 0 else 1.0, float(top_p), 1 if write_logits else 0, n_eos)
    shape, tiling, opts = kernel_constants(cfg, e, attn_splits=attn_splits, grid=p.grid,
                                           rows_per_counter=p.rows_per_counter, vendor=vendor,
                                           sample=sample_mode(temperature, top_k, top_p), trace=trace,
                                           attn_stamps=attn_stamps)
    return (*kernel_groups(b, cfg, e, p, trace), *run, shape, tiling), opts


# ---- compiling for sm_90 without a GPU ----------------------------------------------------------------------

def _triton_bin(name: str) -> Path | None:
    """A tool shipped in the triton wheel (ptxas, cuobjdump, nvdisasm), or on PATH."""
    import triton
    p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if p.is_file() and os.access(p, os.X_OK):
        return p
    w = shutil.which(name)
    return Path(w) if w else None


def ptxas_path() -> Path:
    p = _triton_bin("ptxas")
    if p is None:
        raise UsageError("no ptxas: neither triton/backends/nvidia/bin/ptxas nor one on PATH")
    return p


def load_kernel(path: str | None = None):
    """kernel.monokernel, or the `monokernel` of another file (an edited copy of engine/kernel/entry.py: iterate
    on register pressure without touching the real one)."""
    if path is None:
        from kog.engine.kernel import monokernel
        return monokernel
    import importlib.util
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--kernel {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"kog_regreport_kernel_{abs(hash(str(p.resolve())))}", p)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # triton.jit looks its globals up through the module
    spec.loader.exec_module(mod)
    fn = getattr(mod, "monokernel", None)
    if fn is None:
        raise UsageError(f"--kernel {path}: defines no `monokernel`")
    return fn


def compile_monokernel(args: tuple, meta: dict[str, Any], arch: int = 90, fn=None):
    """Compile kernel.monokernel for (args, meta) the way JITFunction.run would on an sm_`arch` GPU:
    the same binder (Triton's specializations of each argument), options and ASTSource, but with an
    explicit GPUTarget instead of asking the (absent) driver. Returns (CompiledKernel, ptxas log, seconds)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise UsageError("compiling needs TRITON_INTERPRET unset (the interpreter replaces triton.jit)")
    import io
    from contextlib import redirect_stdout

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = fn if fn is not None else load_kernel()
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = dict(meta)
    kwargs["debug"] = False
    kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode   # as JITFunction.run
    bound_args, specialization, _ = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, kwargs)
    src = ASTSource(fn, signature, constexprs, attrs)
    # Triton runs `ptxas -v` itself and prints its log only when asked; a private cache directory makes
    # sure it really compiles (so the seconds are honest and the log exists).
    buf = io.StringIO()
    old = {k: os.environ.get(k) for k in ("TRITON_DUMP_PTXAS_LOG", "TRITON_CACHE_DIR")}
    with tempfile.TemporaryDirectory(prefix="kog-regreport-") as cache:
        os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
        os.environ["TRITON_CACHE_DIR"] = cache
        try:
            t0 = time.perf_counter()
            with redirect_stdout(buf):
                k = triton.compile(src, target=target, options=options.__dict__)
            secs = time.perf_counter() - t0
        finally:
            for key, v in old.items():
                if v is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = v
    return k, buf.getvalue(), secs


_FUNC_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def parse_ptxas_log(log: str, name: str | None = None) -> dict[str, int]:
    """Registers, stack frame and spill bytes of the entry function from `ptxas -v` output."""
    out: dict[str, int] = {}
    cur = None
    for line in log.splitlines():
        m = _FUNC_RE.search(line)
        if m:
            cur = m.group(1)
            continue
        if name is not None and cur is not None and cur != name:
            continue
        m = _FRAME_RE.search(line)
        if m:
            out.update(stack_frame_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                       spill_load_bytes=int(m.group(3)))
        m = _USED_RE.search(line)
        if m:
            out["registers"] = int(m.group(1))
            s = _SMEM_RE.search(line)
            out["ptxas_smem_bytes"] = int(s.group(1)) if s else 0
    if "registers" not in out:
        raise KogError("could not read the register count from the ptxas -v output:\n" + log[-2000:])
    return out


def run_ptxas(ptx: str, arch: str = "sm_90a", extra: list[str] | None = None) -> str:
    """`ptxas -v` on a PTX text (same flags as Triton's make_cubin); returns the log."""
    with tempfile.TemporaryDirectory(prefix="kog-ptxas-") as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        cmd = [str(ptxas_path()), "-lineinfo", "-v", *(extra or []), f"--gpu-name={arch}", str(src),
               "-o", str(Path(d) / "k.cubin")]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise KogError(f"ptxas failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
        return r.stdout + r.stderr


def occupancy(regs: int, smem_bytes: int, num_warps: int) -> dict[str, Any]:
    """CTAs of this kernel that fit on one Hopper SM, and which resource limits it."""
    threads = 32 * num_warps
    per_warp = -(-max(regs, 1) * 32 // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    by = {"registers": REGS_PER_SM // (per_warp * num_warps),
          "threads": THREADS_PER_SM // threads,
          "smem": SMEM_PER_SM // (smem_bytes + SMEM_RESERVED_PER_CTA),
          "cta_limit": MAX_CTAS_PER_SM}
    fit = min(by.values())
    return {"ctas_per_sm_fit": fit, "limited_by": min(by, key=by.get), "fit_by": by,
            "regs_for_ctas": {c: min(MAX_REGS_PER_THREAD, (REGS_PER_SM // (c * threads)) // 8 * 8)
                              for c in (1, 2, 3, 4) if REGS_PER_SM // (c * threads) >= 24}}


# ---- SASS ----------------------------------------------------------------------------------------------------

# one SASS instruction line: its address, opcode (predicate dropped) and operands
_INS_RE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*)", re.MULTILINE)


def _disassemble(cubin: bytes, tools: tuple[tuple[str, list[str]], ...]) -> str:
    """The first of `tools` ((name, flags) shipped in the triton wheel, or on PATH) that disassembles the cubin."""
    with tempfile.TemporaryDirectory(prefix="kog-sass-") as d:
        f = Path(d) / "k.cubin"
        f.write_bytes(cubin)
        for tool, cmd in tools:
            exe = _triton_bin(tool)
            if exe is None:
                continue
            r = subprocess.run([str(exe), *cmd, str(f)], capture_output=True, text=True)
            if r.returncode == 0 and r.stdout.strip():
                return r.stdout
        names = " or ".join(t for t, _ in tools)
        raise UsageError(f"no working {names} (looked in triton/backends/nvidia/bin and PATH)")


def sass_text(cubin: bytes) -> str:
    """Disassembly of a cubin with the cuobjdump (or nvdisasm) shipped in the triton wheel."""
    return _disassemble(cubin, (("cuobjdump", ["-sass"]), ("nvdisasm", ["-c"])))


_TARGET_RE = re.compile(r"0x([0-9a-f]+)")
STREAM_BLOCK_LDS = 16       # a basic block with this many shared loads is a GEMV chunk block (the ring's tiles)


def shared_load_blocks(sass: str) -> list[int]:
    """Shared loads (LDS) of each basic block of the kernel's own code that has at least STREAM_BLOCK_LDS, in
    program order: the GEMV chunk loops' shape. Blocks start at branch targets and after a branch; functions
    the kernel calls (placed after it) are left out. Two variants of the kernel whose chunk blocks match
    stream alike; ptxas laying them out differently (split blocks) cost streaming time."""
    ins = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in _INS_RE.finditer(sass)]
    targets, calls = set(), []
    for _, op, rest in ins:
        t = _TARGET_RE.search(rest) if op.startswith(("BRA", "CALL")) else None
        if t and op.startswith("CALL"):
            calls.append(int(t.group(1), 16))
        elif t:
            targets.add(int(t.group(1), 16))
    if calls:
        ins = [i for i in ins if i[0] < min(calls)]
    out, n, prev_branch = [], 0, False
    for addr, op, _ in ins:
        if (addr in targets or prev_branch) and n:
            out.append(n)
            n = 0
        n += op.startswith("LDS")
        prev_branch = op.startswith(("BRA", "EXIT", "RET", "CALL"))
    out.append(n)
    return [b for b in out if b >= STREAM_BLOCK_LDS]


def sass_with_lines(cubin: bytes) -> str:
    """Disassembly with source lines (`nvdisasm -c -gi`: a `//## File "...", line N` comment before the
    instructions of each line; ptxas keeps them because Triton compiles with -lineinfo)."""
    return _disassemble(cubin, (("nvdisasm", ["-c", "-gi"]),))


_LINE_RE = re.compile(r'//## File "([^"]+)", line (\d+)')
_REG_RE = re.compile(r"\bR(\d+)\b")
# opcodes all of whose operands are read (no destination register first)
_NO_DEST = ("ST", "RED", "BRA", "SYNCS", "UBLKCP", "BAR", "EXIT", "CCTL", "MEMBAR", "ERRBAR", "CALL", "RET", "ISETP",
            "FSETP", "DSETP", "PLOP3", "VOTE")
EXPOSED_WINDOW = 12


def exposed_loads(sass: str, window: int = EXPOSED_WINDOW) -> list[dict[str, Any]]:
    """Global loads whose result an instruction reads within `window` instructions of the load, by source line
    of the load and of that first use, most frequent first: the warp waits the load's whole round trip there
    (an L2 one at least; after an acquire, which invalidates L1, even a small table's). Such a load feeding an
    address or a branch on a hop's path puts its round trip on the critical path (sass: sass_with_lines)."""
    ins, src = [], "?"
    for line in sass.splitlines():
        m = _LINE_RE.search(line)
        if m:
            src = f"{Path(m.group(1)).name}:{m.group(2)}"
            continue
        m = _INS_RE.match(line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2), m.group(3).strip(), src))
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for i, (addr, op, operands, where) in enumerate(ins):
        if not op.startswith("LDG"):
            continue
        dest = _REG_RE.search(operands)
        if dest is None:
            continue
        width = 4 if ".128" in op else 2 if ".64" in op else 1
        regs = {int(dest.group(1)) + k for k in range(width)}
        for _, op2, operands2, where2 in ins[i + 1:i + 1 + window]:
            parts = operands2.split(",", 1)
            reads = operands2 if op2.startswith(_NO_DEST) or len(parts) == 1 else parts[1]
            if regs & {int(r) for r in _REG_RE.findall(reads)}:
                key = (where, where2)
                e = found.setdefault(key, {"load": where, "use": where2, "count": 0, "first_at": hex(addr),
                                           "load_op": op, "use_op": op2})
                e["count"] += 1
                break
            written = _REG_RE.match(parts[0].strip()) if not op2.startswith(_NO_DEST) else None
            if written and int(written.group(1)) in regs:
                break              # overwritten before any read: the load's result is dead here
    return sorted(found.values(), key=lambda e: (-e["count"], e["load"]))


def sass_counts(sass: str) -> dict[str, Any]:
    """Instruction counts that matter for a weight stream: global loads by width, local memory traffic."""
    ops: dict[str, int] = {}
    for m in _INS_RE.finditer(sass):
        ops[m.group(2)] = ops.get(m.group(2), 0) + 1
    ldg = {k: v for k, v in ops.items() if k.startswith("LDG")}
    wide = sum(v for k, v in ldg.items() if ".128" in k)
    return {
        "instructions": sum(ops.values()),
        "ldg_128": wide,
        "ldg_narrower": sum(ldg.values()) - wide,
        # narrower plain (weak) loads: the ones a weight/activation stream could widen; .STRONG are the
        # volatile polls and .cg loads of the sync protocol
        "ldg_narrower_weak": sum(v for k, v in ldg.items() if ".128" not in k and "STRONG" not in k),
        "ldg_by_variant": dict(sorted(ldg.items())),
        "ldl": sum(v for k, v in ops.items() if k.startswith("LDL")),
        "stl": sum(v for k, v in ops.items() if k.startswith("STL")),
        "stg": sum(v for k, v in ops.items() if k.startswith("STG")),
        "atomics": sum(v for k, v in ops.items() if k.startswith(("ATOMG", "RED", "ATOM"))),
        "shared_load_blocks": shared_load_blocks(sass),
    }


# ---- the report ------------------------------------------------------------------------------------------------

def load_model(spec: str) -> ModelConfig:
    """A preset name or an HF checkpoint directory (only its config is read)."""
    from kog.engine.config import preset
    if os.path.isdir(spec):
        from kog.engine.weights import read_config
        return read_config(spec)
    return preset(spec)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """--set key=value pairs for EngineConfig, each value parsed as the field's type."""
    types = {f.name: f.type for f in dataclasses.fields(EngineConfig)}
    out: dict[str, Any] = {}
    for it in items:
        k, sep, v = it.partition("=")
        k = k.strip().replace("-", "_")
        if not sep or not k:
            raise UsageError(f"--set {it!r}: expected key=value")
        if k not in types:
            raise UsageError(f"--set {k}: not an engine config field ({', '.join(types)})")
        t = str(types[k])
        kind = "int" if t in ("int", "<class 'int'>") else "float" if t in ("float", "<class 'float'>") else None
        try:
            out[k] = int(v.replace("_", "")) if kind == "int" else float(v) if kind == "float" else v
        except ValueError:
            raise UsageError(f"--set {k}={v}: not {'an integer' if kind == 'int' else 'a number'}") from None
    return out


def _plain(group) -> dict[str, Any]:
    """A constexpr group (layout.Shape, layout.Tiling) as plain JSON values, nested specs as dicts."""
    return {k: (_plain(v) if isinstance(v, tuple) else getattr(v, "value", v)) for k, v in group._asdict().items()}


def regreport(cfg: ModelConfig, ecfg: EngineConfig, *, maxnreg: int | None = None, sms: int = H200_SMS,
              sass: bool = False, keep_dir: str | None = None, kernel: str | None = None, exposed: bool = False,
              **spec_kw: Any) -> dict[str, Any]:
    """Compile the monokernel for (cfg, ecfg) on sm_90 and report its resources (a JSON-able dict)."""
    ecfg.validate(cfg)
    args, meta = launch_spec(cfg, ecfg, sms=sms, **spec_kw)
    if maxnreg is not None:
        if maxnreg <= 0:
            meta.pop("maxnreg", None)        # --maxnreg 0: no cap at all (ptxas decides, up to 255)
        else:
            meta["maxnreg"] = int(maxnreg)
    k, log, secs = compile_monokernel(args, meta, fn=load_kernel(kernel))
    ptx = k.asm["ptx"]
    if not log.strip():                      # Triton did not print its ptxas log: run ptxas ourselves
        log = run_ptxas(ptx)
    stats = parse_ptxas_log(log, k.metadata.name)
    shared = int(k.metadata.shared or 0)
    ring = 0
    if ecfg.weight_ring:     # the launcher adds the ring after Triton's own, 1 KiB aligned (Monokernel._add_ring_smem)
        from kog.engine.ring import launch_smem, phase_bn, ring_bytes
        extra = ring_bytes(ecfg.weight_ring, block_k=ecfg.block_k, bn=phase_bn(ecfg))
        ring = launch_smem(shared, extra) - shared
    occ = occupancy(stats["registers"], shared + ring, ecfg.num_warps)
    rep: dict[str, Any] = {
        "model": cfg.name, "target": "cuda sm_90 (GPUTarget('cuda', 90, 32))",
        "engine_config": ecfg.to_dict(), "maxnreg": meta.get("maxnreg"), "num_warps": ecfg.num_warps,
        "grid": sms * ecfg.ctas_per_sm, "sms": sms,
        **stats,
        "triton_n_spills": stats["stack_frame_bytes"] // 4,
        "shared_bytes": shared,
        "ring_shared_bytes": ring,
        **occ,
        "ctas_per_sm_requested": ecfg.ctas_per_sm,
        "fits": ecfg.ctas_per_sm <= occ["ctas_per_sm_fit"],
        "compile_seconds": round(secs, 2),
        "ptx_lines": ptx.count("\n"),
        "constexprs": {**_plain(args[-2]), **_plain(args[-1])},
        "kernel": str(Path(kernel).resolve()) if kernel else "kog.engine.kernel",
        "ptxas": str(ptxas_path()),
        "triton": __import__("triton").__version__,
    }
    if keep_dir:
        d = Path(keep_dir)
        d.mkdir(parents=True, exist_ok=True)
        for ext in ("ttir", "ttgir", "llir", "ptx"):
            if ext in k.asm:
                atomic_write_text(d / f"monokernel.{ext}", k.asm[ext])
        atomic_write_bytes(d / "monokernel.cubin", k.asm["cubin"])
        atomic_write_text(d / "ptxas.log", log)
        atomic_write_text(d / "report.json", json.dumps(rep, indent=1))
    if exposed:
        rep["exposed_loads"] = exposed_loads(sass_with_lines(k.asm["cubin"]))
    if sass:
        text = sass_text(k.asm["cubin"])
        rep["sass"] = sass_counts(text)
        if keep_dir:
            atomic_write_text(Path(keep_dir, "monokernel.sass"), text)
            atomic_write_text(Path(keep_dir, "report.json"), json.dumps(rep, indent=1))
    return rep


def format_report(r: dict[str, Any]) -> str:
    lines = [
        f"monokernel {r['model']} on {r['target']}, triton {r['triton']}",
        f"  config: mode={r['engine_config']['mode']} ctas_per_sm={r['ctas_per_sm_requested']} "
        f"num_warps={r['num_warps']} maxnreg={r['maxnreg']} grid={r['grid']}",
        f"  registers/thread   {r['registers']}",
        f"  spill stores/loads {r['spill_store_bytes']} / {r['spill_load_bytes']} bytes",
        f"  stack frame        {r['stack_frame_bytes']} bytes (local memory; Triton n_spills {r['triton_n_spills']})",
        f"  shared memory      {r['shared_bytes']} bytes"
        + (f" + {r['ring_shared_bytes']} of weight ring" if r.get("ring_shared_bytes") else ""),
        f"  CTAs/SM that fit   {r['ctas_per_sm_fit']} (limited by {r['limited_by']}; "
        f"requested {r['ctas_per_sm_requested']}: {'fits' if r['fits'] else 'DOES NOT FIT'})",
        f"  compile            {r['compile_seconds']} s, {r['ptx_lines']} PTX lines",
    ]
    if "sass" in r:
        s = r["sass"]
        lines.append(f"  SASS               {s['instructions']} instructions; LDG.128 {s['ldg_128']}, narrower LDG "
                     f"{s['ldg_narrower']} (weak {s['ldg_narrower_weak']}) {s['ldg_by_variant']}; LDL {s['ldl']}, STL {s['stl']}")
        lines.append(f"  chunk blocks       shared loads {s['shared_load_blocks']}")
    if "exposed_loads" in r:
        lines.append(f"  loads used within {EXPOSED_WINDOW} instructions (count, load line -> first use):")
        lines += [f"    {e['count']:3d}  {e['load']} -> {e['use']}  ({e['load_op']} -> {e['use_op']})"
                  for e in r["exposed_loads"][:20]]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.2-1b", help="preset name or HF checkpoint directory")
    ap.add_argument("--base", choices=["sm90", "plain"], default="sm90",
                    help="the config --set changes: sm90, what the engine runs on an sm_90 GPU with no tuned config "
                         "stored (engine_config.sm90_default for the model and the cache); plain, EngineConfig()")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="EngineConfig field (repeatable), e.g. --set ctas_per_sm=4 --set mode=grid")
    ap.add_argument("--maxnreg", type=int, default=None,
                    help="override the launcher's register cap (default: 65536 / (ctas_per_sm*threads); 0 = none)")
    ap.add_argument("--sms", type=int, default=H200_SMS, help="SMs of the target GPU (grid = sms * ctas_per_sm)")
    ap.add_argument("--kernel", metavar="FILE", default=None,
                    help="compile the `monokernel` of this file (an edited copy of engine/kernel/entry.py) instead")
    ap.add_argument("--prompt-len", type=int, default=64, help="prompt tokens of the launch (pos0 = this - 1)")
    ap.add_argument("--tokens", type=int, default=512, help="tokens the launch decodes (n_tokens)")
    ap.add_argument("--max-seq", type=int, default=None,
                    help="KV cache length (default: prompt + tokens + 1, at least 64, as `kogtune bench`)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--trace", action="store_true", help="the instrumented (TRACE) variant")
    ap.add_argument("--attn-stamps", action="store_true",
                    help="with --trace: the attention splits' sub-step stamps too (Monokernel(attn_stamps=True))")
    ap.add_argument("--sass", action="store_true", help="disassemble and count LDG widths and LDL/STL")
    ap.add_argument("--exposed", action="store_true",
                    help="list the global loads whose result is used right away, by source line (nvdisasm -gi)")
    ap.add_argument("--keep", metavar="DIR", default=None, help="write ttgir/llir/ptx/cubin/ptxas.log (and SASS) here")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    return ap


@cli_entry(PROG)
def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    cfg = load_model(a.model)
    try:
        _, span = cache_span(cfg, a.max_seq, a.prompt_len, a.tokens)
        base = sm90_default(cfg, span) if a.base == "sm90" else EngineConfig()
        ecfg = base.replace(**parse_sets(a.set))
    except TypeError as e:
        raise UsageError(f"--set: {e}") from None
    ecfg.validate(cfg)
    if a.prompt_len < 1 or a.tokens < 1:
        raise UsageError("--prompt-len and --tokens must be >= 1")
    if a.kernel is not None and not os.path.isfile(a.kernel):
        raise UsageError(f"--kernel {a.kernel}: no such file")
    if os.environ.get("TRITON_INTERPRET") == "1":
        # triton.jit already chose the interpreter in this process: compile in a clean one
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        argv = sys.argv[1:] if argv is None else list(argv)
        return subprocess.run([sys.executable, "-m", "kog.engine.regreport", *argv], env=env).returncode
    r = regreport(cfg, ecfg, maxnreg=a.maxnreg, sms=a.sms, sass=a.sass, keep_dir=a.keep, kernel=a.kernel,
                  max_seq=a.max_seq, prompt_len=a.prompt_len, tokens=a.tokens, temperature=a.temperature, top_k=a.top_k,
                  top_p=a.top_p, trace=a.trace, attn_stamps=a.attn_stamps, exposed=a.exposed)
    print(json.dumps(r, indent=1) if a.json else format_report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
