"""Every folder kept under the cache (`locations.cache_root()`), named once.

vllm-overlay reads folders that the test harness writes (a release's test
environment, where `status --probes` runs the probes) and the harness reads
what vllm-overlay downloads (the pinned wheels and sources): both sides take
the paths from here, so that the layout is one file and the import graph
shows who depends on it. Each function takes the cache root, so that a test
or a caller with its own cache (`--cache`, `$VLLM_OVERLAY_CACHE`) gets the
same layout under it.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path

# -- What vllm-overlay itself downloads and writes.


def wheels(cache: Path) -> Path:
    """The pinned vLLM wheels, verified by hash (`fetch`, `pin`)."""
    return cache / "wheels"


def sources(cache: Path) -> Path:
    """The unpacked sdists of the pinned releases, one `sdist_tree` each."""
    return cache / "sources"


def sdist_tree(cache: Path, version: str) -> Path:
    """Release `version`'s unpacked sdist."""
    return sources(cache) / f"vllm-{version}"


def unpinned(cache: Path) -> Path:
    """The `vllm` wheels of releases no pin names, which `status` reads, one
    folder per version (no sha256 to verify them by)."""
    return cache / "unpinned"


def serve_sources(cache: Path) -> Path:
    """The patched sources `vllm-overlay serve` activates, one folder per
    series and installed build."""
    return cache / "serve"


def activations(cache: Path) -> Path:
    """The records of `serve`'s activations, which make a warm start cheap."""
    return serve_sources(cache) / "activations"


def release_env(cache: Path, release: str) -> Path:
    """`release`'s test environment with its patched build: the harness makes
    it (`ci/envs/release.py`), `status --probes` and the benchmarks run in it."""
    return cache / "envs" / release


def release_env_lock(cache: Path, release: str) -> Path:
    """The folder locked while `release_env` is built or checked."""
    return cache / "envs" / f".{release}.lock"


def layered_env(cache: Path, release: str, name: str) -> Path:
    """An environment beside `release_env` that runs over its packages with
    something of its own (`ci/envs/layered.py`), which `name` says: an
    earlier build of the release (`previous-hybridkv.26`, the P/D fleet's
    previous revision or `benchmarks/pd_read_confirmation.py`'s) or a variant
    a benchmark measures (`benchmarks/investigations/pd_progress_pause.py`)."""
    return cache / "envs" / f"{release}-{name}"


# -- What the test harness (`ci/`) writes besides the environments.


def patched_wheels(cache: Path, release: str) -> Path:
    """The patched wheels the harness builds for `release`."""
    return cache / "patched" / release


def upstream_tests(cache: Path, release: str) -> Path:
    """Upstream vLLM's tests of `release`, copied out of its sdist and
    patched by the series."""
    return cache / "upstream-tests" / release


def upstream_vllm_cache(cache: Path, release: str) -> Path:
    """`VLLM_CACHE_ROOT` of `release`'s upstream test runs."""
    return cache / "vllm-cache" / release


def hf_standin(cache: Path) -> Path:
    """`HF_HOME` of the offline Hugging Face hub stand-in."""
    return cache / "hf-standin"


def reports(cache: Path, checkout: Path) -> Path:
    """The JUnit reports of the harness's pytest runs from `checkout`, and
    its record of the static checks' last pass there: one folder per
    checkout, as two checkouts (a maintainer's and a scratch clone) share
    the cache and may run at once."""
    key = hashlib.sha256(str(checkout.resolve()).encode()).hexdigest()[:12]
    return cache / "reports" / f"{checkout.name}-{key}"


@dataclass(frozen=True)
class SuiteFolders:
    """What an end-to-end suite keeps under its own folder: the tiny models
    it serves, the servers' logs and their `VLLM_CACHE_ROOT`."""

    root: Path

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def vllm_cache(self) -> Path:
        return self.root / "vllm-cache"


def serve_e2e(cache: Path) -> SuiteFolders:
    """`vllm-overlay serve` end to end, and the index install that serves the
    same tiny model."""
    return SuiteFolders(cache / "serve-e2e")


def unpatched_envs(cache: Path) -> Path:
    """The cheap environments of a release's unpatched wheel
    (`ci/envs/unpatched.py`), one per release and kind."""
    return serve_e2e(cache).root / "envs"


def pd_e2e(cache: Path) -> SuiteFolders:
    """Prefill/decode over NIXL end to end on the CPU."""
    return SuiteFolders(cache / "pd-e2e")


def gpu_e2e(cache: Path) -> SuiteFolders:
    """The P/D cases on a GPU."""
    return SuiteFolders(cache / "gpu-e2e")


def gpu_env(cache: Path, release: str) -> Path:
    """The GPU run's environment of `release`: the pinned CUDA wheel with its
    dependencies, as a user installs it."""
    return gpu_e2e(cache).root / release / "venv"
