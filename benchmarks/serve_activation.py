"""What `vllm-overlay serve` adds to a process's start, before vLLM is imported.

Every Python process vLLM spawns pays the activation in `boot/
sitecustomize.py` (import the finder, read the description, install it); the
serving process pays `prepare()` + `activate()` once (find the installed
vLLM, hash the files the series touches, check the cached patched files).
Each arm is a fresh interpreter in the unpatched release environment of
`ci/envs/unpatched.py`, timed from launch to exit, the arms alternating run by
run; the script prints each arm's median and its overhead over a bare
interpreter (`python -c pass`) from this one run. A warm start reuses the
record of the last one (`runtime/warm.py`). The budget for both
activations is 50 ms. The first start of a series over a build also applies
it (`git apply`) into the cache: timed separately, with a fresh cache each
time.

Usage: python -m benchmarks.serve_activation [RELEASE] [--runs N]
(the environment must exist: python -m ci.suites.serve_e2e RELEASE)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vllm_overlay.common import cache_layout
from vllm_overlay.common.locations import REPO_ROOT, cache_root
from vllm_overlay.runtime.propagate import ENVIRONMENT_VARIABLE
from vllm_overlay.series.facts import e2e_release

BUDGET_MS = 50.0
# What the console script runs before it hands over to vLLM.
SERVING = (
    "import vllm_overlay.launcher\n"
    "from vllm_overlay.runtime.serve import activate, prepare\n"
    "activate(prepare())"
)
EXPORTED = f"""
import json, os
from vllm_overlay.runtime import propagate
from vllm_overlay.runtime.serve import prepare
activation = prepare()
propagate.export(activation.sources, activation.package_dir)
names = ("PYTHONPATH", "{ENVIRONMENT_VARIABLE}")
print(json.dumps({{name: os.environ[name] for name in names}}))
"""


def base_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.pop(ENVIRONMENT_VARIABLE, None)
    return env


def timed(python: Path, code: str, env: dict[str, str]) -> float:
    """Seconds from launching `python -c code` to its exit."""
    start = time.perf_counter()
    subprocess.run([str(python), "-c", code], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("release", nargs="?", default=e2e_release())
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--cold-runs", type=int, default=5)
    args = parser.parse_args()
    python = cache_layout.unpatched_envs(cache_root()) / args.release / "bin" / "python"
    if not python.exists():
        sys.exit(f"{python} does not exist; run python -m ci.suites.serve_e2e first")
    bare = base_environment()
    serving = {**bare, "PYTHONPATH": str(REPO_ROOT)}
    exported = subprocess.run(
        [str(python), "-c", EXPORTED],
        env=serving,
        check=True,
        capture_output=True,
        text=True,
    )
    spawned = {**bare, **json.loads(exported.stdout)}
    arms = {
        "bare interpreter": ("pass", bare),
        "spawned process (sitecustomize)": ("pass", spawned),
        "serving process (warm cache)": (SERVING, serving),
    }
    samples: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.runs):
        for name, (code, env) in arms.items():
            samples[name].append(timed(python, code, env))
    cold = []
    for _ in range(args.cold_runs):
        with tempfile.TemporaryDirectory(prefix="vllm-overlay-bench-") as tmp:
            cold.append(timed(python, SERVING, {**serving, "VLLM_OVERLAY_CACHE": tmp}))
    medians = {
        name: statistics.median(values) * 1e3 for name, values in samples.items()
    }
    base = medians["bare interpreter"]
    print(
        f"vLLM {args.release} (unpatched, {python.parent.parent}): interpreter "
        f"start to ready-to-import-vLLM, median of {args.runs} runs per arm"
    )
    for name, median in medians.items():
        line = f"  {name:34} {median:7.1f} ms"
        if name != "bare interpreter":
            extra = median - base
            within = "within" if extra < BUDGET_MS else "OVER"
            line += f"  +{extra:5.1f} ms  x{median / base:.2f}  {within} budget"
        print(line)
    print(
        f"  {'serving process, first start':34} "
        f"{statistics.median(cold) * 1e3:7.1f} ms  (cold cache: applies the "
        f"series; median of {args.cold_runs})"
    )


if __name__ == "__main__":
    main()
