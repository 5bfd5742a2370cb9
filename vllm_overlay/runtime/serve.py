"""`vllm-overlay serve ARGS...`: `vllm serve ARGS...` with the series for the
installed vLLM active in every process vLLM starts, and nothing written to
site-packages.

Everything that can refuse is decided before the first vLLM import: no series
for the installed release, an installed file that differs from its RECORD, a
patch that does not apply exactly, an installed build that is already patched,
patched modules already imported, or interpreter flags that would keep spawned
processes from the overlay. So a serving process either runs the whole series
everywhere or does not start.
"""

import sys
from collections.abc import Sequence
from pathlib import Path

from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.common.locations import cache_root, series_root
from vllm_overlay.runtime import dist_alias, propagate, source_overlay
from vllm_overlay.runtime.warm import Activation, recorded_activation, save_activation


def prepare() -> Activation:
    """Check the installed vLLM and the series, and have the patched files
    ready in the cache; imports nothing of vLLM. A start over the same files
    as the last one reuses its checked result (see `warm.py`)."""
    if sys.flags.no_site or sys.flags.ignore_environment:
        raise OverlayError(
            "Python runs with -S, -E or -I, which vLLM's spawned processes "
            "inherit: they would run without the series"
        )
    cache, root = cache_root(), series_root()
    recorded = recorded_activation(cache, root)
    if recorded is not None:
        return recorded
    activation, installed = _prepare_from_scratch(cache)
    save_activation(cache, root, activation, installed)
    return activation


def _prepare_from_scratch(cache: Path) -> tuple[Activation, list[str]]:
    """The full check; returns the activation and the installed files it
    read. Its modules load the series parser, TOML, `packaging` and
    `dataclasses`, so they are imported only when a start needs them."""
    from vllm_overlay.runtime.catalog import series_for
    from vllm_overlay.runtime.installed import installed_vllm
    from vllm_overlay.runtime.sources import patched_sources

    installed = installed_vllm()
    patched = installed.patched_series()
    if patched is not None:
        raise OverlayError(
            f"the installed vLLM is already a patched build ({patched}); "
            "use plain `vllm serve`"
        )
    series = series_for(installed.release)
    originals = installed.verified_sources(series.touched_files)
    names = ", ".join(patch.name for patch in series.patches)
    summary = (
        f"vllm-overlay: serving {installed.dist} {installed.version} "
        f"with series {series.series_id}: {names}"
    )
    sources = patched_sources(series, originals, cache)
    alias = installed.dist_info if installed.needs_vllm_alias() else None
    activation = Activation(
        series.series_id, summary, installed.package_dir, sources, alias
    )
    return activation, sorted(originals)


def activate(activation: Activation) -> None:
    """Overlay this process and every process it starts from now on, and log
    the series once (processes that inherit it stay silent)."""
    source_overlay.install(activation.sources)
    if activation.vllm_alias is not None:
        dist_alias.install(activation.vllm_alias)
    propagate.export(activation.sources, activation.package_dir, activation.vllm_alias)
    print(activation.summary, file=sys.stderr, flush=True)


def serve(vllm_args: Sequence[str]) -> int:
    """`vllm serve VLLM_ARGS...`, overlaid; a refusal is one line and exit
    status 1, before anything of vLLM runs."""
    try:
        activate(prepare())
    except OverlayError as exc:
        report_error(exc)
        return 1
    run_vllm_serve(vllm_args)
    return 0


def run_vllm_serve(vllm_args: Sequence[str]) -> None:
    """Run vLLM's own `vllm` entry point as `vllm serve VLLM_ARGS...`, so that
    the arguments, the help and the process layout are exactly vLLM's."""
    sys.argv = ["vllm", "serve", *vllm_args]
    from vllm.entrypoints.cli.main import main

    main()
