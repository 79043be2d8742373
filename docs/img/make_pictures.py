"""Re-make the README's report pictures (docs/img/*.png) from the data that ships with kog; no GPU needed.

    python docs/img/make_pictures.py          # needs Chromium (/usr/bin/chromium) and Pillow

Each picture is the top of one report: the topology report of the bundled H200 scan, the engine report of
the bundled H200 bench, and the tuning report of the 60-trial search recorded on the H200
(docs/lab/h200/search_llama-3.2-1b_2026-12-01.json; its trials are loaded into a fresh Optuna study, each
parameter's distribution being the values the search tried, so the report can compute importances).
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

IMG = Path(__file__).resolve().parent
REPO = IMG.parents[1]
SEARCH = REPO / "docs/lab/h200/search_llama-3.2-1b_2026-12-01.json"
WIDTH, SHOWN = 1400, 1000                 # browser window width, picture width
TOPS = {"scan": 1560, "bench": 1750, "tuning": 1490}   # how much of each page's top to keep (window px)


def tuning_study(tmp: Path) -> Path:
    import optuna
    import pandas as pd
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from kog.runstore import RunStore
    from kog.reports.synthetic import h200_device

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    doc = json.loads(SEARCH.read_text())
    df = pd.DataFrame(doc["trials"])
    pcols = [c for c in df.columns if c.startswith("params_")]
    dists = {c[7:]: CategoricalDistribution(sorted({v for v in df[c] if v == v}, key=str)) for c in pcols}
    name = doc["study_summary"]["study"]
    run = RunStore(tmp / "runs").create("study", h200_device("NVIDIA H200"),
                                        argv=["kogtune", "search", "--model", doc["model"], "--trials", "60"],
                                        extra={"study_name": name, "storage": "sqlite:///study.db"})
    with run:
        st = optuna.create_study(study_name=name, storage=f"sqlite:///{run.path / 'study.db'}",
                                 direction="maximize")
        for k, v in doc["study_summary"]["attrs"].items():
            st.set_user_attr(k, v)
        for r in df.to_dict("records"):
            params = {c[7:]: r[c] for c in pcols if r[c] == r[c]}
            attrs = {c[11:]: v for c, v in r.items() if c.startswith("user_attrs_") and v is not None
                     and not (isinstance(v, float) and math.isnan(v))}
            if int(r["number"]) == 0:      # kogtune search queues the engine's default config first
                attrs["baseline"] = "engine default"
            state = TrialState[r["state"]]
            st.add_trial(create_trial(state=state, value=r["value"] if state == TrialState.COMPLETE else None,
                                      params=params, distributions={k: dists[k] for k in params},
                                      user_attrs=attrs))
    return Path(run.path)


def main() -> int:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("make_pictures: Chromium not found", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        from kog.probe.cli import main as kogprobe
        from kog.reports.tuning import render_study_report
        from kog.tune.cli import main as kogtune
        if kogprobe(["report", "--bundled", "-o", str(tmp / "scan.html")]) or \
                kogtune(["report", "--bundled", "-o", str(tmp / "bench.html")]):
            return 1
        render_study_report(tuning_study(tmp), tmp / "tuning.html")
        for name, top in TOPS.items():
            shot = tmp / f"{name}.png"
            subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            f"--screenshot={shot}", f"--window-size={WIDTH},{top}",
                            f"file://{tmp / name}.html"], check=True, capture_output=True)
            im = Image.open(shot).convert("RGB").crop((0, 0, WIDTH, top))
            im = im.resize((SHOWN, round(top * SHOWN / WIDTH)), Image.LANCZOS)
            out = IMG / f"{name}-report.png"
            im.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
            print(out.relative_to(REPO), f"{out.stat().st_size // 1024} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
