"""A finished `kogtune search` on a GPU into kog's built-in table (tune/data/builtin_tuned.json), naming the study.

    python -m kog.tune.promote --storage sqlite:///runs/kog-studies.db --study kog-nvidia-h200-llama-3.2-3b

The study's trials are exported to a committed file (tune/data/studies/<study>.json: every trial's number,
state, value, parameters, config and failure reason, and the study's attributes), and the best completed
single-GPU trial becomes the entry for the study's device, model shape and dtype, its source naming that file,
the trial, the engine default's tok/s measured in the same study (the search queues the engine default first)
and the gain over it that the search's closing confirmation measured (kog.tune.search.confirm_best: the best
and the default re-measured in alternation; the best of many single measurements is biased up). What the
engine then runs for that shape is the searched config (store.builtin_config).

Refused with one line: a simulated study (the table holds measurements), a study without a measured
engine-default trial (no same-run comparison) or without a confirmation of its best, and a best trial whose
confirmed gain over the default is less than --min-gain (nothing worth replacing the rule with).
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from kog.errors import KogError, UsageError, cli_entry
from kog.tune.search import CONFIRMATION, best_and_default, completed_single_gpu

PROG = "python -m kog.tune.promote"
REPO = Path(__file__).resolve().parent.parent
STUDIES = Path(__file__).resolve().parent / "data" / "studies"
MIN_GAIN = 0.01          # below this a search's best is within run-to-run noise of the engine default
TRIAL_ATTRS = ("config", "baseline", "fail_reason", "fail_kind", "wall_s", "reused_from")


def load_study(storage: str, name: str):
    """The study, or UsageError naming what is missing."""
    import optuna
    from kog.tune.search import absolute_storage, open_storage, redact
    url = absolute_storage(storage)
    try:
        return optuna.load_study(study_name=name, storage=open_storage(url))
    except KeyError:
        raise UsageError(f"no study {name!r} in {redact(url)}") from None


def choose(study, min_gain: float) -> tuple[Any, Any, float]:
    """(best trial, engine-default trial, gain) or KogError saying why nothing is promoted."""
    attrs = study.user_attrs
    if attrs.get("backend") != "gpu":
        raise UsageError(f"study {study.study_name!r} is not a GPU study (backend {attrs.get('backend')!r}): "
                         "the built-in table holds measurements only")
    pair = best_and_default(study)
    if pair is None:
        if not completed_single_gpu(study):
            raise KogError(f"study {study.study_name!r} has no completed single-GPU trial")
        raise KogError(f"study {study.study_name!r} has no measured engine-default trial to compare with "
                       "(the search queues it first in a new study)")
    best, default = pair
    conf = attrs.get(CONFIRMATION) or {}
    if conf.get("best_trial") != best.number or conf.get("gain") is None:
        raise KogError(f"study {study.study_name!r} has no same-run confirmation of its best trial "
                       f"(#{best.number}): run the search again (it ends by re-measuring the best against the "
                       "engine default; --confirm-rounds)")
    gain = float(conf["gain"])
    if gain < min_gain:
        raise KogError(f"nothing to promote: the best trial (#{best.number}, {best.value:.1f} tok/s in the search) "
                       f"is {gain:+.1%} against the engine default (#{default.number}) in the confirmation's "
                       f"{conf['rounds']} alternating rounds, below --min-gain {min_gain:.1%}")
    return best, default, gain


def export_study(study, path: Path, storage: str) -> dict[str, Any]:
    """Every trial of the study (in number order) and its attributes, as the committed JSON at `path`."""
    from kog.fsutil import atomic_write_text
    from kog.tune.search import redact
    trials = [{"number": t.number, "state": t.state.name, "value": t.value, "params": t.params,
               **{k: t.user_attrs[k] for k in TRIAL_ATTRS if k in t.user_attrs}}
              for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)]
    doc = {"study": study.study_name, "storage": redact(storage), "attrs": study.user_attrs, "trials": trials}
    atomic_write_text(path, json.dumps(doc, indent=1, default=str) + "\n")
    return doc


def builtin_entry(study, best, default, gain: float, study_file: str) -> tuple[str, dict[str, Any]]:
    """(key, entry) of the built-in table for the study's device, shape and dtype."""
    a = study.user_attrs
    done = completed_single_gpu(study)
    src = {"backend": "gpu", "commit": a.get("git_commit"), "study": study.study_name, "from": study_file,
           "trial": best.number, "engine_default_trial": default.number,
           "engine_default_tok_per_s": round(default.value, 2), "gain": round(gain, 4),
           "confirmation": a.get(CONFIRMATION),
           "why": f"kogtune search: the best of {len(done)} completed trials, {gain:+.1%} over the engine "
                  f"default (trial #{default.number}) in the study's closing same-run confirmation"}
    entry = {"device": a["device"], "model": a.get("model"), "shape": a["model_shape"], "dtype": a["dtype"],
             "config": best.user_attrs["config"], "tok_per_s": round(best.value, 2),
             "mode_measured": best.user_attrs["config"].get("mode"), "source": src}
    return "|".join([a["device"], a["model_shape"], a["dtype"]]), entry


def promote(storage: str, name: str, builtin: Path, studies: Path, min_gain: float = MIN_GAIN) -> dict[str, Any]:
    """Export the study and write its best trial into `builtin`; the entry written."""
    from kog.runstore import atomic_write_json
    from kog.tune.store import _load, engine_config
    study = load_study(storage, name)
    best, default, gain = choose(study, min_gain)
    engine_config(best.user_attrs["config"])              # a config this kog can run, or ConfigError
    studies.mkdir(parents=True, exist_ok=True)
    path = studies / f"{re.sub(r'[^A-Za-z0-9._-]+', '-', name)}.json"
    export_study(study, path, storage)
    try:
        shown = path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        shown = str(path)
    key, entry = builtin_entry(study, best, default, gain, shown)
    table = _load(builtin, user_store=False)
    table["entries"][key] = entry
    atomic_write_json(builtin, table)
    return entry


@cli_entry(PROG)
def main(argv: list[str] | None = None) -> int:
    from kog.tune.store import BUILTIN
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--storage", required=True, help="the search's Optuna storage URL")
    ap.add_argument("--study", required=True, help="the study name")
    ap.add_argument("--builtin", type=Path, default=BUILTIN, help="the built-in table to write (default: kog's own)")
    ap.add_argument("--studies-dir", type=Path, default=STUDIES, help="where the study's export goes")
    ap.add_argument("--min-gain", type=float, default=MIN_GAIN,
                    help="least gain of the best trial over the engine default (default: 0.01)")
    a = ap.parse_args(argv)
    e = promote(a.storage, a.study, a.builtin, a.studies_dir, a.min_gain)
    s = e["source"]
    print(f"{e['model']} ({e['shape']}, {e['dtype']}) on {e['device']}: trial #{s['trial']} "
          f"{e['tok_per_s']:.1f} tok/s, {s['gain']:+.1%} over the engine default; study exported to {s['from']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
