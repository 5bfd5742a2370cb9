"""`vllm-overlay doctor [serve args]`: before a launch, say which flag
combinations fail or silently degrade for hybrid models with KV connectors.

Starting vLLM to find out costs minutes (the best-known failure comes after
the weights load), so doctor builds only what `vllm serve` builds before
that: the parsed arguments and the engine configuration. It gathers facts
(`gather.py`) from the installed vLLM, with the series applied as
`vllm-overlay serve` applies it (`build.py`), and judges them with pure
rules (`rules.py`, and `rules_speculative.py` for speculative decoding).
"""

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.doctor.build import evaluated_sources, installed_build
from vllm_overlay.doctor.facts import Facts
from vllm_overlay.doctor.report import Report
from vllm_overlay.doctor.rules import evaluate


def diagnose(
    serve_args: list[str],
    *,
    with_series: bool = True,
    peer_args: list[str] | None = None,
) -> Report:
    """Judge `vllm serve SERVE_ARGS` on this environment's vLLM; with
    `with_series` False, as plain `vllm serve` runs an unpatched build; with
    `peer_args`, as one server of a P/D pair whose other server runs
    `vllm serve PEER_ARGS`."""
    if serve_args[:1] == ["--"]:
        serve_args = serve_args[1:]
    build = installed_build()
    if build.version is None:
        facts = Facts(build=build)
    else:
        from vllm_overlay.doctor.gather import gather

        with evaluated_sources(build, with_series) as evaluated:
            try:
                facts = gather(serve_args, evaluated, peer_args)
            except ImportError as exc:
                # `vllm serve` would fail the same way before any flag counts.
                raise OverlayError(
                    f"the installed vLLM {build.version} does not import ({exc}): "
                    "its dependencies are missing here (a wheel installed with "
                    "--no-deps into an environment without them?); install it "
                    "over the vLLM it patches, or with its requirements"
                ) from None
    return Report(facts, tuple(evaluate(facts)))
