"""What a run records of the code and environment that made it: the git commit, a digest of the Python
sources as imported, and the versions of the packages that matter to a measurement."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

# kog's parts as (label, module): the label names the part's files in source_digest
PARTS = (("core", "kog"), ("probe", "kog.probe"), ("tune", "kog.tune"), ("engine", "kog.engine"),
         ("reports", "kog.reports"))


def git_commit(cwd: Path | None = None) -> str | None:
    """The commit of the kog source tree ("<sha>-dirty" with uncommitted changes), None outside git.

    KOG_GIT_COMMIT overrides it: a copy of the tree without its history (a device machine's checkout copy)
    cannot name its commit itself."""
    if os.environ.get("KOG_GIT_COMMIT"):
        return os.environ["KOG_GIT_COMMIT"]
    here = cwd or Path(__file__).resolve().parent
    try:
        r = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "HEAD"], cwd=here, capture_output=True,
                           text=True, timeout=5)
        sha = r.stdout.strip()
        if r.returncode != 0 or len(sha) != 40:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception:
        return None


def _source_files() -> list[tuple[str, Path, Path]]:
    """(label, root, file) of every .py file of kog's parts, found without importing them. The core is the
    `kog` folder's own files only: in an installed tree the subpackages are folders inside it."""
    from importlib.util import find_spec
    out = []
    for label, module in PARTS:
        spec = find_spec(module)
        if spec is None or not spec.origin:
            continue
        root = Path(spec.origin).resolve().parent
        files = root.glob("*.py") if label == "core" else root.rglob("*.py")
        out += [(label, root, f) for f in sorted(files) if "__pycache__" not in f.parts]
    return out


def source_digest() -> str:
    """sha256 (16 hex digits) of kog's Python sources as imported, by path and content. It names the code
    that ran where the commit cannot: a device machine's copy of the tree may carry stale git metadata, so
    benches record both; hash a checkout with
    `python -c "from kog.provenance import source_digest; print(source_digest())"` to match one."""
    import hashlib
    h = hashlib.sha256()
    for label, root, f in _source_files():
        h.update(f"{label}/{f.relative_to(root).as_posix()}\0".encode())
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def package_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("kog", "torch", "triton", "optuna", "pandas", "pyarrow", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    try:
        import torch
        out["cuda"] = torch.version.cuda
        out["hip"] = getattr(torch.version, "hip", None)
    except Exception:
        pass
    return out
