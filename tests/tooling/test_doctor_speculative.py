"""`vllm-overlay doctor` and speculative decoding, on facts written by hand
(`rules_speculative.py`), and the `--peer` option: a hybrid model that
speculates with prefix caching on the CPU platform, and a P/D pair whose
servers differ in what NIXL's compatibility hash covers."""

from dataclasses import replace

import pytest
from conftest import run_cli
from test_doctor_rules import (
    CPU,
    LLAMA,
    NIXL,
    NIXL_OK,
    PATCHED,
    QWEN35,
    UNPATCHED,
    facts,
)

from vllm_overlay.arguments import parse
from vllm_overlay.doctor.compat import differences
from vllm_overlay.doctor.facts import (
    NO_SPECULATION,
    ConnectorFacts,
    FactorDifference,
    Facts,
    LaunchFacts,
    PeerFacts,
    SpeculativeFacts,
)
from vllm_overlay.doctor.findings import Finding, Severity
from vllm_overlay.doctor.report import Report
from vllm_overlay.doctor.rules import evaluate
from vllm_overlay.doctor.rules_speculative import (
    pd_pair,
    speculation_on_cpu_without_kernels,
    speculative_hybrid_prefix_caching_on_cpu,
)

MTP = SpeculativeFacts("mtp", 1, "tiny-qwen3.5")
NGRAM = SpeculativeFacts("ngram", 3)
TYPE_ERROR = "`TypeError: 'function' object is not subscriptable`"
MISMATCH = "`RuntimeError: NIXL compatibility hash mismatch`"
# What `gather` records for the tiny Qwen3.5 with an MTP layer: MTP on this
# server and not on the peer (0.31.0 on hash MTP's method and draft model).
SPEC_DIFFERENCE = FactorDifference(
    "speculative_config", "method 'mtp', model 'tiny-qwen3.5'", "none"
)


def speculating(speculative: SpeculativeFacts = MTP, **launch: object) -> LaunchFacts:
    return replace(CPU, speculative=speculative, **launch)


def cpu_findings(f: Facts) -> list[Finding]:
    return list(speculative_hybrid_prefix_caching_on_cpu(f))


@pytest.mark.parametrize(
    ("version", "launch", "where"),
    [
        (
            "0.32.0",
            ("precopy_mamba_align_fused_kernel", 1226),
            "mamba_utils.py:1226 (precopy_mamba_align_fused_kernel, vLLM 0.32.0)",
        ),
        (
            "0.22.1",
            ("postprocess_mamba_fused_kernel", 510),
            "mamba_utils.py:510 (postprocess_mamba_fused_kernel, vLLM 0.22.1)",
        ),
        ("0.34.0", None, "in vLLM's Mamba state copy for speculative decoding"),
    ],
)
def test_speculation_with_hybrid_prefix_caching_on_the_cpu_is_refused(
    version, launch, where
):
    build = replace(PATCHED, version=version)
    for speculative in (MTP, NGRAM):
        on_cpu = speculating(speculative, mamba_kernel_launch=launch)
        f = facts(NIXL, build=build, launch=on_cpu, hma=True)
        (error,) = cpu_findings(f)
        assert error.severity == Severity.ERROR
        assert f"speculative decoding ({speculative.describe()})" in error.what
        assert TYPE_ERROR in error.what and where in error.what
        assert "--no-enable-prefix-caching" in error.fix and "GPU" in error.fix
        assert Report(f, tuple(evaluate(f))).exit_code == 1


@pytest.mark.parametrize(
    ("model", "launch"),
    [
        (QWEN35, CPU),  # no config built: not known
        (QWEN35, speculating(NO_SPECULATION)),
        (LLAMA, speculating(mamba_cache_mode=None, hybrid_block_size=None)),
        (QWEN35, speculating(prefix_caching=False, mamba_cache_mode="none")),
        (QWEN35, speculating(platform="cuda")),
        # 0.34.0 runs on an x86 CPU only with triton-cpu, whose kernels launch.
        (QWEN35, speculating(cpu_requires_triton=True)),
    ],
    ids=["unknown", "off", "not-hybrid", "no-prefix-caching", "gpu", "triton-cpu"],
)
def test_no_speculative_finding_outside_that_case(model, launch):
    f = facts(NIXL, model=model, launch=launch, hma=True, nixl=NIXL_OK)
    assert cpu_findings(f) == []
    assert list(pd_pair(f)) == []  # no --peer
    problems = [x for x in evaluate(f) if x.severity > Severity.INFO]
    assert problems == []


def peer(
    speculative: SpeculativeFacts = NO_SPECULATION,
    found: tuple[FactorDifference, ...] | None = (SPEC_DIFFERENCE,),
    *connectors: ConnectorFacts,
    **launch: object,
) -> PeerFacts:
    """The other server: the tiny Qwen3.5 without prefix caching on the CPU."""
    return PeerFacts(
        model="tiny-qwen3.5",
        hybrid=True,
        launch=replace(
            CPU, **{"speculative": speculative, "mamba_cache_mode": "none", **launch}
        ),
        connectors=connectors or (NIXL,),
        hash_differences=found,
    )


def pair(
    other: PeerFacts,
    *connectors: ConnectorFacts,
    speculative: SpeculativeFacts = MTP,
    **extra: object,
) -> Facts:
    """This server: MTP (by default) without prefix caching, so only the
    pair is judged."""
    mine = speculating(speculative, prefix_caching=False, mamba_cache_mode="none")
    return facts(*(connectors or (NIXL,)), launch=mine, hma=True, peer=other, **extra)


def test_a_pair_where_only_one_server_runs_mtp_is_named_before_launch():
    f = pair(peer())
    (finding,) = pd_pair(f)
    assert finding.severity == Severity.ERROR
    assert MISMATCH in finding.what and "at the first request" in finding.what
    assert (
        "speculative decoding (this one: mtp, 1 speculative token(s), draft "
        "model tiny-qwen3.5; the peer (--peer): off)"
    ) in finding.what
    assert finding.fix.startswith("give both servers the same --speculative-config")


def test_every_hashed_difference_is_named_speculative_first():
    found = (
        FactorDifference("speculative_config.method", "'mtp'", "'eagle'"),
        FactorDifference("speculative_config.model", "'m'", "'drafter'"),
        FactorDifference("dtype", "torch.bfloat16", "torch.float32"),
        FactorDifference("model", "'/a/m'", "'/b/m'"),
        FactorDifference("num_kv_heads", "2", "4"),
    )
    eagle = SpeculativeFacts("eagle", 2, "drafter")
    (finding,) = pd_pair(pair(peer(eagle, found)))
    assert "speculative decoding (method, model differ; this one: mtp" in finding.what
    assert "the peer (--peer): eagle, 2 speculative token(s), draft model drafter" in (
        finding.what
    )
    assert finding.what.index("speculative") < finding.what.index("dtype (")
    assert "dtype (torch.bfloat16 here, torch.float32 on the peer)" in finding.what
    assert "model ('/a/m' here, '/b/m' on the peer)" in finding.what
    fixes = finding.fix.split("; ")
    assert fixes[0].startswith("give both servers the same --speculative-config")
    assert "the same --dtype on both" in fixes
    assert "make num_kv_heads agree" in fixes


@pytest.mark.parametrize(
    ("mine", "theirs", "severity"),
    [
        (None, None, Severity.ERROR),
        (False, None, Severity.ERROR),
        (False, False, Severity.WARNING),
        (False, "false", Severity.ERROR),
    ],
)
def test_the_handshake_check_fails_only_where_a_server_keeps_it(mine, theirs, severity):
    here = replace(NIXL, handshake_check=mine)
    there = replace(NIXL, handshake_check=theirs)
    (finding,) = pd_pair(pair(peer(NO_SPECULATION, (SPEC_DIFFERENCE,), there), here))
    assert finding.severity == severity
    assert (MISMATCH in finding.what) is (severity == Severity.ERROR)


@pytest.mark.parametrize("theirs", [NGRAM, NO_SPECULATION])
def test_a_draft_the_hash_misses_is_a_warning(theirs):
    # 0.31.0 on do not hash n-gram or draft_model speculation, and 0.22.1
    # no speculative setting at all: MTP on one server only.
    (finding,) = pd_pair(pair(peer(theirs, ())))
    assert finding.severity == Severity.WARNING
    assert f"the peer (--peer): {theirs.describe()}" in finding.what
    assert "does not compare" in finding.what
    assert finding.fix == "give both servers the same --speculative-config"


UNPATCHED_0_22_1 = replace(UNPATCHED, version="0.22.1", pinned_series=None)
MTP_3 = replace(MTP, num_speculative_tokens=3)


@pytest.mark.parametrize(
    ("mine", "theirs", "build", "severity"),
    [
        (MTP, MTP_3, PATCHED, Severity.INFO),
        (NGRAM, NO_SPECULATION, PATCHED, Severity.INFO),
        (NGRAM, replace(NGRAM, num_speculative_tokens=5), PATCHED, Severity.INFO),
        (
            MTP,
            replace(MTP, num_speculative_tokens=3),
            UNPATCHED_0_22_1,
            Severity.WARNING,
        ),
        (NGRAM, NO_SPECULATION, UNPATCHED_0_22_1, Severity.WARNING),
        (NGRAM, NO_SPECULATION, replace(PATCHED, version="0.22.1"), Severity.INFO),
    ],
)
def test_speculative_blocks_may_differ_where_the_state_is_exchanged_alone(
    mine, theirs, build, severity
):
    (finding,) = pd_pair(pair(peer(theirs, ()), speculative=mine, build=build))
    assert finding.severity == severity
    assert "speculate differently" in finding.what
    if severity == Severity.WARNING:
        assert "unpatched 0.22.1" in finding.what
        assert "run both servers patched" in finding.fix


def test_a_pair_that_agrees_is_only_explained():
    f = pair(peer(MTP, ()))
    (finding,) = pd_pair(f)
    assert finding.severity == Severity.INFO
    assert "agree" in finding.what and MTP.describe() in finding.what
    assert Report(f, tuple(evaluate(f))).exit_code == 0


def test_the_peer_is_judged_for_speculation_on_the_cpu_too():
    other = peer(MTP, (), mamba_cache_mode="align")
    (error,) = cpu_findings(pair(other))
    assert error.what.startswith("the peer (--peer): speculative decoding (mtp,")
    plain = replace(other, hybrid=False)
    assert cpu_findings(pair(plain)) == []


CANNOT_INSPECT = "`TypeError: Cannot inspect kernel parameters for function`"


@pytest.mark.parametrize("speculative", [MTP, NGRAM])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_speculation_where_the_cpu_kernels_do_not_reach_their_launch_is_refused(
    speculative, prefix_caching
):
    """vLLM 0.30.0 on the CPU: any method fails at the first request, with
    prefix caching or without, so the prefix-caching finding (whose fix is to
    turn it off) is not given beside it."""
    build = replace(PATCHED, version="0.30.0")
    launch = speculating(
        speculative,
        cpu_speculation_kernels=False,
        prefix_caching=prefix_caching,
        mamba_cache_mode="align" if prefix_caching else "none",
        mamba_kernel_launch=("precopy_mamba_align_fused_kernel", 1213),
    )
    f = facts(NIXL, build=build, launch=launch, hma=True)
    (error,) = speculation_on_cpu_without_kernels(f)
    assert error.severity == Severity.ERROR
    assert f"speculative decoding ({speculative.describe()})" in error.what
    assert "CPU platform of vLLM 0.30.0" in error.what and CANNOT_INSPECT in error.what
    assert "0.31.0" in error.fix and "--speculative-config" in error.fix
    assert cpu_findings(f) == []
    assert Report(f, tuple(evaluate(f))).exit_code == 1
    # The peer of a pair is judged the same way.
    other = peer(NGRAM, (), cpu_speculation_kernels=False)
    (on_peer,) = speculation_on_cpu_without_kernels(pair(other))
    assert on_peer.what.startswith("the peer (--peer): speculative decoding (ngram")


@pytest.mark.parametrize(
    "launch",
    [
        speculating(cpu_speculation_kernels=True),
        speculating(cpu_speculation_kernels=None),  # the files were not found
        speculating(NO_SPECULATION, cpu_speculation_kernels=False),
        speculating(platform="cuda", cpu_speculation_kernels=False),
    ],
    ids=["reached", "unknown", "not-speculating", "gpu"],
)
def test_no_kernel_finding_where_they_reach_their_launch_or_nothing_speculates(launch):
    f = facts(NIXL, launch=launch, hma=True)
    assert list(speculation_on_cpu_without_kernels(f)) == []


def test_a_peer_vllm_refuses_is_an_error_and_nothing_is_compared():
    refused = peer(found=None, config_error="ValueError: no such thing")
    (error,) = pd_pair(pair(refused))
    assert error.severity == Severity.ERROR
    assert "vLLM refuses the configuration of the peer (--peer)" in error.what
    assert "ValueError: no such thing" in error.what
    assert "change the flags it names in the peer's arguments" in error.fix
    refused = peer(
        found=None, config_error="vLLM on x86 CPUs requires Triton (triton-cpu)."
    )
    (error,) = pd_pair(pair(refused))
    assert "install triton-cpu" in error.fix


@pytest.mark.parametrize(
    ("here", "there", "side"),
    [
        (ConnectorFacts("ExampleConnector", False), NIXL, "only one server"),
        (NIXL, ConnectorFacts("LMCacheMPConnector", True), "only one server"),
        (ConnectorFacts("ExampleConnector", False),) * 2 + ("neither server",),
    ],
)
def test_a_pair_without_nixl_on_both_sides_is_not_compared(here, there, side):
    (finding,) = pd_pair(pair(peer(MTP, (SPEC_DIFFERENCE,), there), here))
    assert finding.severity == Severity.WARNING
    assert f"{side} selects it: nothing was compared" in finding.what


def test_a_hash_doctor_cannot_compute_is_said_so():
    (finding,) = pd_pair(pair(peer(MTP, None)))
    assert finding.severity == Severity.INFO
    assert "could not compute" in finding.what


def test_differences_of_the_hash_factors_speculative_first():
    spec = {"method": "mtp", "model": "/m", "revision": None}
    here = {"model": "/m", "dtype": "bf16", "speculative_config": spec}
    assert differences(here, dict(here)) == ()
    off = differences(here, {**here, "speculative_config": None})
    assert off == (
        FactorDifference("speculative_config", "method 'mtp', model '/m'", "none"),
    )
    other = {**here, "dtype": "fp32", "speculative_config": {**spec, "model": "/d"}}
    assert [d.name for d in differences(here, other)] == [
        "speculative_config.model",
        "dtype",
    ]
    assert differences(here, other)[0] == FactorDifference(
        "speculative_config.model", "'/m'", "'/d'"
    )
    assert differences({"a": 1}, {"b": 2}) == (
        FactorDifference("a", "1", "none"),
        FactorDifference("b", "none", "2"),
    )


def test_report_header_names_speculation_and_the_peer():
    text = Report(f := pair(peer()), tuple(evaluate(f))).render()
    assert "speculative: mtp, 1 speculative token(s), draft model tiny-qwen3.5" in text
    assert "peer:        tiny-qwen3.5: NixlConnector (HMA); speculative: off" in text


def test_peer_arguments_are_split_as_a_shell_splits_them():
    config = '{"method": "mtp", "num_speculative_tokens": 1}'
    for given in (
        f"m --speculative-config '{config}'",
        f"vllm serve m --speculative-config '{config}'",
        f"vllm-overlay serve -- m --speculative-config '{config}'",
    ):
        args = parse(["doctor", "--peer", given, "--", "x"])
        assert args.peer == ["m", "--speculative-config", config]
        assert args.serve_args == ["--", "x"]
    assert parse(["doctor", "x"]).peer is None


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("m --speculative-config '{", "cannot split"),
        ("", "names no arguments"),
        ("vllm serve", "names no arguments"),
    ],
)
def test_bad_peer_arguments_are_one_line(capsys, given, why):
    code, out, err = run_cli(capsys, "doctor", "--peer", given, "--", "x")
    assert (code, out) == (1, "")
    (line,) = err.splitlines()
    assert line.startswith("vllm-overlay: error: vllm-overlay doctor: argument --peer")
    assert why in line
