"""One-off: copy data and reference summaries from a posteriordb checkout into ``data/``.

Not run by the benchmark (which never downloads or reads outside this repository). It was run
once against a bare clone of https://github.com/stan-dev/posteriordb:

    python benchmarks/real_models/extract.py /path/to/posteriordb.git

For each posterior in ``POSTERIORS`` it writes ``data/<posterior>.json`` (gzipped when large)
with the posteriordb data set, the provenance (paths and commit) and, where posteriordb has
reference draws (10 chains x 1,000 draws of long Stan runs), the per-parameter mean, sd and
number of draws, with the bulk ESS that posteriordb reports for them. Posteriors without
reference draws get their reference from ``nuts_reference.py``.
"""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

DATA_DIR = Path(__file__).parent / "data"
PDB = "posterior_database"
POSTERIORS = [
    "diamonds-diamonds",
    "nes2000-nes",
    "kidiq-kidscore_interaction",
    "earnings-logearn_interaction_z",
    "sblrc-blr",
    "mesquite-logmesquite_logvash",
    "kilpisjarvi_mod-kilpisjarvi",
    "arK-arK",
    "low_dim_gauss_mix-low_dim_gauss_mix",
    "eight_schools-eight_schools_noncentered",
    "wells_data-wells_daae_c_model",
    "radon_mn-radon_variable_intercept_centered",
    "radon_mn-radon_variable_intercept_noncentered",
]
GZIP_ABOVE = 200_000  # bytes of JSON


def git_show(git_dir: Path, path: str) -> bytes:
    """Bytes of ``HEAD:path`` in the bare repository ``git_dir``."""
    cmd = ["git", f"--git-dir={git_dir}", "show", f"HEAD:{path}"]
    return subprocess.run(cmd, check=True, capture_output=True).stdout


def unzip_json(blob: bytes) -> Any:
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        return json.loads(archive.read(archive.namelist()[0]))


def reference_summary(git_dir: Path, name: str) -> dict[str, Any]:
    """Mean, sd and number of draws per parameter of posteriordb's reference draws."""
    draws_path = f"{PDB}/reference_posteriors/draws/draws/{name}.json.zip"
    info_path = f"{PDB}/reference_posteriors/draws/info/{name}.info.json"
    chains = unzip_json(git_show(git_dir, draws_path))
    info = json.loads(git_show(git_dir, info_path))
    diag = info["diagnostics"]
    names = diag["diagnostic_information"]["names"]
    ess = dict(zip(names, diag["effective_sample_size_bulk"], strict=True))
    params = {}
    for param in chains[0]:
        values = np.concatenate([np.asarray(chain[param], dtype=float) for chain in chains])
        params[param] = {
            "mean": float(values.mean()),
            "sd": float(values.std(ddof=1)),
            "ess_bulk": float(ess.get(param, values.size)),
        }
    return {
        "source": "posteriordb reference draws (Stan NUTS)",
        "path": draws_path,
        "method": info["inference"],
        "n_draws": int(sum(len(chain[next(iter(chain))]) for chain in chains)),
        "n_chains": len(chains),
        "params": params,
    }


def extract(git_dir: Path, name: str, commit: str) -> Path:
    posterior = json.loads(git_show(git_dir, f"{PDB}/posteriors/{name}.json"))
    data_path = f"{PDB}/data/data/{posterior['data_name']}.json.zip"
    payload: dict[str, Any] = {
        "posterior": name,
        "provenance": {
            "repository": "https://github.com/stan-dev/posteriordb",
            "commit": commit,
            "posterior": f"{PDB}/posteriors/{name}.json",
            "data": data_path,
            "stan_model": f"{PDB}/models/stan/{posterior['model_name']}.stan",
        },
        "data": unzip_json(git_show(git_dir, data_path)),
        "reference": None,
    }
    if posterior.get("reference_posterior_name"):
        payload["reference"] = reference_summary(git_dir, name)
    return write(payload)


def write(payload: dict[str, Any]) -> Path:
    """Write ``payload`` as ``data/<posterior>.json``, or ``.json.gz`` when large."""
    data = json.dumps(payload["data"], separators=(",", ":"))
    text = json.dumps({**payload, "data": "@DATA@"}, indent=1).replace('"@DATA@"', data)
    DATA_DIR.mkdir(exist_ok=True)
    stem = DATA_DIR / payload["posterior"]
    for old in (stem.with_suffix(".json"), stem.with_suffix(".json.gz")):
        old.unlink(missing_ok=True)
    if len(text) > GZIP_ABOVE:
        path = stem.with_suffix(".json.gz")
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path = stem.with_suffix(".json")
        path.write_text(text + "\n")
    return path


def main(git_dir: Path) -> None:
    cmd = ["git", f"--git-dir={git_dir}", "rev-parse", "HEAD"]
    commit = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
    for name in POSTERIORS:
        print(extract(git_dir, name, commit))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
