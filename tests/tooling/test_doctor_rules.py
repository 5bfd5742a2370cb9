"""`vllm-overlay doctor`'s rules on facts written by hand: each rule's
verdict, without vLLM. The facts below are what `gather` records for the
launches named in each test."""

from dataclasses import replace

import pytest

from vllm_overlay.doctor.facts import (
    BuildFacts,
    ConnectorFacts,
    DependencyFacts,
    Facts,
    LaunchFacts,
    LMCacheFacts,
    ModelFacts,
)
from vllm_overlay.doctor.findings import Severity
from vllm_overlay.doctor.report import Report
from vllm_overlay.doctor.rules import evaluate, hma_enabled, without_hma

PATCHED = BuildFacts(
    version="0.32.0",
    distribution="vllm",
    installed_series="vllm-0.32.0+hybridkv.2",
    installed_is_current=True,
    pinned_series="vllm-0.32.0+hybridkv.2",
    pinned_releases=("0.31.0", "0.32.0", "0.33.0"),
)
UNPATCHED = replace(PATCHED, installed_series=None, installed_is_current=None)
QWEN35 = ModelFacts(
    "tiny-qwen3.5",
    True,
    "vLLM's model registry",
    "Qwen3_5ForCausalLM; layer types: full_attention, linear_attention",
)
LLAMA = ModelFacts("tiny-llama", False, "vLLM's model registry", "LlamaForCausalLM")
GEMMA = replace(LLAMA, name="tiny-gemma3", mixed_attention=True)
# A CPU launch with default flags, as vLLM resolves it for a hybrid model.
CPU = LaunchFacts(
    platform="cpu",
    platform_supports_hma=True,
    prefix_caching=True,
    chunked_prefill=True,
    mamba_cache_mode="align",
)
EXAMPLE = ConnectorFacts("ExampleConnector", False)
NIXL = ConnectorFacts("NixlConnector", True)
LMCACHE_UNPATCHED = ConnectorFacts("LMCacheConnectorV1", False)
LMCACHE_PATCHED = ConnectorFacts("LMCacheConnectorV1", True)
NIXL_OK = DependencyFacts("nixl", True)
LMCACHE_OK = LMCacheFacts("lmcache", True, restores_recurrent_state=False)


def facts(
    *connectors: ConnectorFacts,
    model: ModelFacts = QWEN35,
    build: BuildFacts = PATCHED,
    launch: LaunchFacts = CPU,
    hma: bool | None = None,
    **extra: object,
) -> Facts:
    """A launch; `hma` is vLLM's decision (None: predicted by the rules)."""
    launch = replace(launch, hma_enabled=hma)
    return Facts(build, model, launch, tuple(connectors), **extra)


def findings(f: Facts, severity: Severity) -> list[str]:
    return [x.what for x in evaluate(f) if x.severity == severity]


def fixes(f: Facts) -> str:
    return " ".join(x.fix for x in evaluate(f) if x.fix)


def test_hybrid_model_with_a_connector_without_hma_fails_to_start():
    f = facts(EXAMPLE, hma=False)
    (error,) = findings(f, Severity.ERROR)
    assert "Failed to promote local KV cache specs to one unified type." in error
    assert "ExampleConnector" in error
    assert "NixlConnector" in fixes(f)
    assert Report(f, tuple(evaluate(f))).exit_code == 1


def test_hma_is_predicted_as_vllm_decides_when_the_config_was_not_built():
    assert hma_enabled(facts(EXAMPLE)) is False
    assert hma_enabled(facts(NIXL)) is True
    assert hma_enabled(facts()) is True
    assert hma_enabled(facts(ConnectorFacts("Mystery", None))) is None
    no_platform = replace(CPU, platform_supports_hma=False)
    assert hma_enabled(facts(NIXL, launch=no_platform)) is False
    # An explicit flag wins over everything, either way.
    assert hma_enabled(facts(EXAMPLE, launch=replace(CPU, hma_flag=False))) is True
    assert hma_enabled(facts(NIXL, launch=replace(CPU, hma_flag=True))) is False
    # vLLM's own decision, when it built the config, is taken as it is.
    assert hma_enabled(facts(EXAMPLE, hma=True)) is True
    assert hma_enabled(Facts(PATCHED)) is None


def test_multi_connector_is_blamed_on_its_children_without_hma():
    multi = ConnectorFacts("MultiConnector", False)
    child = replace(LMCACHE_UNPATCHED, parent="MultiConnector")
    nixl = replace(NIXL, parent="MultiConnector")
    assert without_hma(facts(multi, nixl, child)) == [child]
    assert without_hma(facts(multi)) == [multi]  # no children at all
    (error,) = findings(facts(multi, nixl, child, hma=False), Severity.ERROR)
    assert "selects LMCacheConnectorV1," in error


def test_unpatched_lmcache_points_at_the_series_when_it_is_not_applied():
    build = UNPATCHED  # --without-series: judged as plain `vllm serve`
    f = facts(LMCACHE_UNPATCHED, build=build, hma=False, lmcache=LMCACHE_OK)
    assert findings(f, Severity.ERROR)
    assert "`vllm-overlay serve`" in fixes(f)
    unpinned = replace(build, pinned_series=None)
    f = facts(LMCACHE_UNPATCHED, build=unpinned, hma=False, lmcache=LMCACHE_OK)
    assert "patched build of a pinned release (0.31.0, 0.32.0, 0.33.0)" in fixes(f)


def test_disabling_hma_by_flag_breaks_a_hybrid_model():
    f = facts(NIXL, launch=replace(CPU, hma_flag=True), hma=False, nixl=NIXL_OK)
    (error,) = findings(f, Severity.ERROR)
    assert "--disable-hybrid-kv-cache-manager" in error
    assert "drop --disable-hybrid-kv-cache-manager" in fixes(f)


def test_a_platform_without_hma_breaks_a_hybrid_model():
    launch = replace(CPU, platform="tpu", platform_supports_hma=False)
    (error,) = findings(facts(launch=launch, hma=False), Severity.ERROR)
    assert "the tpu platform does not support it" in error


def test_forcing_hma_with_a_connector_without_it_fails_for_any_model():
    launch = replace(CPU, hma_flag=False)
    for model in (QWEN35, LLAMA):
        f = facts(EXAMPLE, model=model, launch=launch, hma=True)
        (error,) = findings(f, Severity.ERROR)
        assert "Connector ExampleConnector does not support HMA" in error


def test_non_hybrid_model_with_example_connector_is_fine():
    f = facts(EXAMPLE, model=LLAMA, hma=False)
    assert findings(f, Severity.ERROR) == findings(f, Severity.WARNING) == []
    assert any("not hybrid" in what for what in findings(f, Severity.INFO))
    assert Report(f, tuple(evaluate(f))).exit_code == 0


def test_sliding_window_model_loses_its_groups_without_hma():
    (warning,) = findings(facts(EXAMPLE, model=GEMMA, hma=False), Severity.WARNING)
    assert "sliding-window layers" in warning


def test_unknown_model_gets_a_conditional_warning():
    unknown = ModelFacts("who-knows", None, "no config.json found locally")
    (warning,) = findings(facts(EXAMPLE, model=unknown, hma=False), Severity.WARNING)
    assert "could not tell whether who-knows is hybrid" in warning
    assert "Failed to promote" in warning


def test_nixl_without_the_nixl_package_fails_to_start():
    missing = DependencyFacts("nixl", False, "ModuleNotFoundError: No module named")
    f = facts(NIXL, hma=True, nixl=missing)
    (error,) = findings(f, Severity.ERROR)
    assert "NIXL is not available" in error
    assert "Failed to promote" not in " ".join(findings(f, Severity.ERROR))
    assert any("stays on" in what for what in findings(f, Severity.INFO))
    assert findings(facts(NIXL, hma=True, nixl=NIXL_OK), Severity.ERROR) == []


def test_patched_lmcache_gives_a_hybrid_model_no_hits_without_state_restore():
    f = facts(LMCACHE_PATCHED, hma=True, lmcache=LMCACHE_OK)
    assert findings(f, Severity.ERROR) == []
    (warning,) = findings(f, Severity.WARNING)
    assert "zero external hits" in warning
    assert "declares `restores_recurrent_state = True`, and this one does not" in (
        warning
    )


def test_patched_lmcache_hits_with_an_adapter_that_restores_state():
    adapter = replace(LMCACHE_OK, restores_recurrent_state=True)
    f = facts(LMCACHE_PATCHED, hma=True, lmcache=adapter)
    assert findings(f, Severity.WARNING) == []
    assert any("gets external hits" in w for w in findings(f, Severity.INFO))


def test_missing_lmcache_fails_and_its_adapter_cannot_be_inspected():
    missing = LMCacheFacts("lmcache", False, "ModuleNotFoundError: No module")
    f = facts(LMCACHE_PATCHED, hma=True, lmcache=missing)
    (error,) = findings(f, Severity.ERROR)
    assert "No module" in error
    (warning,) = findings(f, Severity.WARNING)
    assert "could not be inspected" in warning


def test_patched_lmcache_gives_a_sliding_window_model_no_hits():
    f = facts(LMCACHE_PATCHED, model=GEMMA, hma=True, lmcache=LMCACHE_OK)
    (warning,) = findings(f, Severity.WARNING)
    assert "sliding-window and full-attention groups" in warning
    assert "--disable-hybrid-kv-cache-manager" in fixes(f)
    assert (
        findings(facts(LMCACHE_PATCHED, model=LLAMA, hma=True), Severity.WARNING) == []
    )


def test_no_device_platform_is_one_error_not_two():
    launch = replace(CPU, platform=None, config_error="RuntimeError: Failed to infer")
    (error,) = findings(facts(launch=launch), Severity.ERROR)
    assert "VLLM_TARGET_DEVICE" in fixes(facts(launch=launch))
    assert "no device platform" in error


def test_vllm_refusing_the_config_is_reported_with_its_message():
    launch = replace(CPU, config_error="AssertionError: Chunked prefill is required")
    f = facts(
        ConnectorFacts("Nope", None, error="ValueError: not registered"), launch=launch
    )
    (error,) = findings(f, Severity.ERROR)
    assert "Chunked prefill is required" in error


def test_an_unknown_connector_is_reported_when_the_config_did_not_say_so():
    f = facts(ConnectorFacts("Nope", None, error="ValueError: not registered"))
    (error,) = findings(f, Severity.ERROR)
    assert "Nope cannot be loaded: ValueError: not registered" in error


@pytest.mark.parametrize(
    ("launch", "expected"),
    [
        (CPU, "mamba_cache_mode align"),
        (replace(CPU, block_size=64), "--block-size 64 is only a floor"),
        (
            replace(CPU, prefix_caching=False, mamba_cache_mode="none"),
            "prefix caching is off",
        ),
    ],
)
def test_hybrid_prefix_caching_rules_are_explained(launch, expected):
    infos = findings(facts(NIXL, launch=launch, hma=True, nixl=NIXL_OK), Severity.INFO)
    assert any(expected in what for what in infos)


def test_no_prefix_caching_note_when_the_model_does_not_start():
    infos = findings(facts(EXAMPLE, hma=False), Severity.INFO)
    assert not any("mamba_cache_mode" in what for what in infos)


@pytest.mark.parametrize(
    ("build", "severity", "expected"),
    [
        (PATCHED, Severity.INFO, "is a patched build: vllm-0.32.0+hybridkv.2"),
        (
            replace(PATCHED, installed_is_current=False),
            Severity.WARNING,
            "older series",
        ),
        (
            replace(UNPATCHED, applied_series="vllm-0.32.0+hybridkv.2"),
            Severity.INFO,
            "judged with the series vllm-0.32.0+hybridkv.2 applied",
        ),
        (UNPATCHED, Severity.INFO, "judged as plain `vllm serve`"),
        (
            replace(UNPATCHED, version="0.30.0", pinned_series=None),
            Severity.INFO,
            "has no series here",
        ),
        (
            replace(UNPATCHED, series_error="x.patch does not apply exactly"),
            Severity.ERROR,
            "cannot be applied: x.patch does not apply exactly",
        ),
    ],
)
def test_the_series_state_is_reported(build, severity, expected):
    f = facts(model=LLAMA, build=build)
    assert any(expected in what for what in findings(f, severity))


def test_without_vllm_there_is_one_error_and_nothing_else():
    f = Facts(BuildFacts(version=None, pinned_releases=("0.32.0",)))
    (finding,) = evaluate(f)
    assert finding.severity == Severity.ERROR
    assert "not installed" in finding.what
    report = Report(f, (finding,))
    assert report.exit_code == 1
    assert report.render().startswith("vLLM:        not installed\n")


def test_report_states_the_facts_and_wraps_findings():
    f = facts(
        ConnectorFacts("MultiConnector", True),
        replace(NIXL, parent="MultiConnector"),
        hma=True,
        nixl=DependencyFacts("nixl", False, "ModuleNotFoundError: No module named"),
    )
    text = Report(f, tuple(evaluate(f))).render()
    assert "vLLM:        0.32.0 (vllm), vllm-0.32.0+hybridkv.2\n" in text
    assert "model:       tiny-qwen3.5: hybrid (Qwen3_5ForCausalLM" in text
    assert "MultiConnector (HMA), MultiConnector child NixlConnector (HMA)" in text
    assert "hybrid KV cache manager: on\n" in text
    assert all(len(line) <= 88 for line in text.splitlines()[4:])
    assert text.index("error:") < text.index("info:")
    assert text.endswith("1 error(s), 0 warning(s): vLLM would not start as asked\n")
