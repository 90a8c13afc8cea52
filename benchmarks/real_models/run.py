"""Real-model benchmark: posteriordb posteriors against their reference posteriors.

Each (model, configuration) runs in its own process under a time and memory limit, and the
results go to ``benchmarks/results/real_models.json`` and ``.md``:

    python benchmarks/real_models/run.py --configs austerity-taylor2 barker-taylor2 \
        barker-taylor2-split                                # the recipes (about 11 minutes)
    python benchmarks/real_models/run.py --configs austerity-defaults barker-defaults \
        --name real_models_defaults                         # no arguments at all
    python benchmarks/real_models/run.py --models arK-arK --configs austerity-taylor2

Per run: status (ok / refused / error / timeout), max over parameters of |mean error| / reference
sd and of |mean error| / combined Monte Carlo standard error, min and max sd ratio, min ESS,
mean rows read per draw (``sample_stats["n_data"]``, summed over the steps of a compound step),
N, wall seconds (reference point, step setup and ``pm.sample``; not the imports), and the
first lines of a refusal or error and of the package's warnings. Edit ``CONFIGS`` to change
what is run; the data and references are the files in ``data/`` (see ``extract.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

RESULTS = HERE.parent / "results"
TIMEOUT_S = 300  # per run, compilation included
MEMORY_BYTES = 8 * 2**30  # address-space limit of each run
MEAN_TOL = 0.3  # |mean error| / reference sd
SD_RATIO = (0.8, 1.2)  # accepted range of sd / reference sd
CV = {"control_variate": "taylor2", "batch_size": 100}


@dataclass(frozen=True)
class Config:
    """One recommended configuration: a step of ``pymc_subsample`` and how ``pm.sample`` runs.

    With ``reference_point`` the run calls ``ref = pms.find_reference_point()`` (over all free
    variables), passes ``reference_point=ref`` to the step and ``initvals=ref.initvals`` to
    ``pm.sample``. With ``split_hyperparameters`` (the recipe for hierarchical models in
    ``docs/control_variates.md``) it runs only on models that declare hyperparameters: the
    reference point and the step with ``step_kwargs`` cover the other variables, and the
    hyperparameters get their own step of the same class with only the batch size.
    """

    step: str
    step_kwargs: dict[str, Any] = field(default_factory=dict)
    reference_point: bool = True
    draws: int = 5000
    tune: int = 1500
    chains: int = 2
    split_hyperparameters: bool = False


# The recommended configurations: edit here.
CONFIGS: dict[str, Config] = {
    "austerity-taylor2": Config("AusterityMH", CV),
    "barker-taylor2": Config("MinibatchBarkerMH", CV),
    # An 87-dimensional random walk: long chains (the ESS column says how long is enough).
    "barker-taylor2-split": Config(
        "MinibatchBarkerMH", CV, draws=40_000, tune=3000, split_hyperparameters=True
    ),
    # Zero configuration (issue 14): the step with no arguments, pm.sample with no initvals.
    "austerity-defaults": Config("AusterityMH", reference_point=False, draws=2000, tune=1000),
    "barker-defaults": Config("MinibatchBarkerMH", reference_point=False, draws=2000, tune=1000),
}


def child(posterior: str, config_name: str, out: Path) -> None:
    """Run one (model, configuration) and write its result to ``out``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_one(posterior, CONFIGS[config_name])
    messages = [str(w.message) for w in caught if "pymc_subsample" in type(w.message).__module__]
    result["warnings"] = [first_lines(m) for m in dict.fromkeys(messages)][:3]
    out.write_text(json.dumps(result, indent=1))


def run_one(posterior: str, config: Config) -> dict[str, Any]:
    """Build, sample and compare; exceptions become a refused or error status."""
    import pymc as pm
    from models import MODELS, load

    import pymc_subsample as pms

    payload = load(posterior)
    model, n_rows = MODELS[posterior].build(payload["data"])
    result: dict[str, Any] = {"N": n_rows, "phase": "reference point"}
    start = time.perf_counter()
    try:
        with model:
            kwargs = dict(config.step_kwargs)
            initvals = None
            names = MODELS[posterior].hyperparameters if config.split_hyperparameters else ()
            hyper = [model[name] for name in names]
            lik = [v for v in model.free_RVs if v not in hyper] if hyper else None
            if config.reference_point:
                ref = pms.find_reference_point(lik, random_seed=1)
                kwargs["reference_point"], initvals = ref, ref.initvals
            result["phase"] = "step setup"
            step_class = getattr(pms, config.step)
            step = step_class(lik, **kwargs)
            result["proposal"] = step.proposal_kind
            result["draw_path"] = step.draw_path
            if hyper:
                batch_size = config.step_kwargs.get("batch_size", 100)
                step = [step, step_class(hyper, batch_size=batch_size)]
            result["phase"] = "sampling"
            idata = pm.sample(
                config.draws,
                tune=config.tune,
                chains=config.chains,
                cores=1,
                step=step,
                initvals=initvals,
                random_seed=1,
                progressbar=False,
                compute_convergence_checks=False,
            )
    except Exception as exc:  # every failure is a result
        result.update(failure(exc))
        result["wall_s"] = round(time.perf_counter() - start, 1)
        return result
    result["wall_s"] = round(time.perf_counter() - start, 1)
    result.update(compare(idata, payload["reference"]["params"]))
    result["rows_per_draw"] = rows_per_draw(idata)
    result["status"] = "ok"
    return result


def failure(exc: Exception) -> dict[str, Any]:
    """Refused: a ValueError or NotImplementedError raised by the package's own code."""
    frames = traceback.extract_tb(exc.__traceback__)
    raised_by_package = bool(frames) and "pymc_subsample" in frames[-1].filename
    refused = raised_by_package and isinstance(exc, ValueError | NotImplementedError)
    where = ""
    if frames:
        where = f"{frames[-1].filename.split('site-packages/')[-1]}:{frames[-1].lineno}"
    return {
        "status": "refused" if refused else "error",
        "message": f"{type(exc).__name__}: {first_lines(str(exc))}",
        "raised_at": where,
    }


def first_lines(text: str, n: int = 3, width: int = 400) -> str:
    return " ".join(text.strip().splitlines()[:n])[:width]


def rows_per_draw(idata: Any) -> float:
    """Mean rows read per draw, summed over the steps of a compound step."""
    n_data = np.asarray(idata.sample_stats["n_data"].values, dtype="float64")
    return float(n_data.reshape(n_data.shape[0], n_data.shape[1], -1).sum(axis=2).mean())


def compare(idata: Any, reference: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Errors of means and sds against the reference, per parameter and their extremes."""
    from summary import ess_mean, stan_names

    draws = stan_names(idata.posterior)
    rows = {}
    for name, ref in reference.items():
        if name not in draws:
            continue
        x = draws[name]
        ess = ess_mean(x)
        mcse = np.sqrt(x.var(ddof=1) / ess + ref["sd"] ** 2 / ref["ess_bulk"])
        error = abs(x.mean() - ref["mean"])
        rows[name] = {
            "mean": float(x.mean()),
            "sd": float(x.std(ddof=1)),
            "ess": round(ess, 1),
            "err_sd": float(error / ref["sd"]),
            "err_mcse": float(error / mcse),
            "sd_ratio": float(x.std(ddof=1) / ref["sd"]),
        }
    return {
        "n_params": len(rows),
        "max_err_sd": max(r["err_sd"] for r in rows.values()),
        "max_err_mcse": max(r["err_mcse"] for r in rows.values()),
        "sd_ratio_min": min(r["sd_ratio"] for r in rows.values()),
        "sd_ratio_max": max(r["sd_ratio"] for r in rows.values()),
        "min_ess": min(r["ess"] for r in rows.values()),
        "worst_param": max(rows, key=lambda k: rows[k]["err_sd"]),
        "params": rows,
    }


def launch(posterior: str, config_name: str) -> dict[str, Any]:
    """Run one (model, configuration) in a fresh process under the limits."""
    from common import run_limited

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--child", posterior, config_name, str(out)]
        env = {**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning"}
        start = time.perf_counter()
        proc = run_limited(cmd, timeout_s=TIMEOUT_S, memory_bytes=MEMORY_BYTES, env=env)
        if proc is None:
            return {"status": "timeout", "message": f"no result within {TIMEOUT_S} s"}
        if out.exists():
            result = json.loads(out.read_text())
        else:
            tail = first_lines("\n".join(proc.stderr.strip().splitlines()[-3:]))
            result = {"status": "error", "message": f"exit {proc.returncode}: {tail}"}
        result["process_s"] = round(time.perf_counter() - start, 1)
        return result


def verdict(result: dict[str, Any]) -> str:
    if result["status"] != "ok":
        return result["status"]
    lo, hi = SD_RATIO
    good = result["max_err_sd"] <= MEAN_TOL and lo <= result["sd_ratio_min"]
    return "pass" if good and result["sd_ratio_max"] <= hi else "FAIL"


def main() -> None:
    from models import MODELS, load

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    parser.add_argument("--name", default="real_models", help="results file name, no suffix")
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "CONFIG", "OUT"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], Path(args.child[2]))
        return
    start = time.perf_counter()
    runs = []
    for posterior in args.models:
        for name in args.configs:
            if CONFIGS[name].split_hyperparameters and not MODELS[posterior].hyperparameters:
                continue  # the split recipe is for hierarchical models only
            result = {"model": posterior, "kind": MODELS[posterior].kind, "config": name}
            result |= launch(posterior, name)
            result["verdict"] = verdict(result)
            print(summary_line(result), flush=True)
            runs.append(result)
    total = round(time.perf_counter() - start, 1)
    write(runs, total, {m: load(m)["reference"] for m in args.models}, args.name)


def summary_line(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return f"{r['model']:48s} {r['config']:18s} {r['status']}: {r.get('message', '')}"
    return (
        f"{r['model']:48s} {r['config']:18s} {r['verdict']} err/sd {r['max_err_sd']:.2f} "
        f"err/mcse {r['max_err_mcse']:.1f} sd {r['sd_ratio_min']:.2f}-{r['sd_ratio_max']:.2f} "
        f"rows/draw {r['rows_per_draw']:.0f} of {r['N']} wall {r['wall_s']} s"
    )


def write(
    runs: list[dict[str, Any]], total_s: float, refs: dict[str, Any], name: str = "real_models"
) -> None:
    """``results/<name>.json`` and ``results/<name>.md``."""
    from common import machine

    sources = {m: {k: v for k, v in r.items() if k != "params"} for m, r in refs.items()}
    payload = {
        "machine": machine(),
        "total_wall_s": total_s,
        "configs": {k: asdict(v) for k, v in CONFIGS.items()},
        "limits": {"timeout_s": TIMEOUT_S, "memory_bytes": MEMORY_BYTES},
        "tolerances": {"mean_err_sd": MEAN_TOL, "sd_ratio": SD_RATIO},
        "references": sources,
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown(runs, total_s) + "\n")
    print(f"wrote {RESULTS / name}.json and .md ({total_s} s)")


def markdown(runs: list[dict[str, Any]], total_s: float) -> str:
    """The results table, one row per (model, configuration)."""
    head = (
        "| model | kind | N | configuration | verdict | max abs mean err / sd "
        "| max err / MCSE | sd ratio | min ESS | rows / draw | proposal, draw "
        "| wall (s) | message |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head] + [table_row(r) for r in runs]
    lines.append(f"\nTotal wall time {total_s:.0f} s.")
    return "\n".join(lines)


def table_row(r: dict[str, Any]) -> str:
    message = r.get("message") or "; ".join(r.get("warnings", []))
    message = message.replace("|", "\\|")[:300]
    cells = [r["model"], r["kind"], str(r.get("N", "")), r["config"], r["verdict"]]
    if r["status"] == "ok":
        cells += [
            f"{r['max_err_sd']:.2f} ({r['worst_param']})",
            f"{r['max_err_mcse']:.1f}",
            f"{r['sd_ratio_min']:.2f} to {r['sd_ratio_max']:.2f}",
            f"{r['min_ess']:.0f}",
            f"{r['rows_per_draw']:.0f}",
        ]
    else:
        cells += [""] * 5
    path = r.get("draw_path", "")
    cells.append(
        f"{r.get('proposal', '')}, {'fused' if path == 'fused' else 'python'}" if path else ""
    )
    cells += [f"{r.get('wall_s', '')}", message]
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    main()
