"""The plugins that serve the unpatched sources: `pristine` (raw verdicts) and
`unpatched` (inverted, to prove probes fail without their patches)."""

import json
import zipfile

import pytest
from conftest import sha256_file

from vllm_overlay.track.status.probing import probe_outcomes

PROBES = """
def test_sees_the_patch():
    from vllm.mod import VALUE
    assert VALUE == "patched"

def test_weak_probe():
    assert True
"""

# Probes that fail on the unpatched sources before their assertion, as real
# ones did: vLLM 0.34.0's CPU platform refusing a host without triton-cpu as
# a probe builds its config, and a probe's helper choosing a signature by
# counting parameters (`add_new_req_to_recv() takes from 4 to 5 positional
# arguments but 6 were given`). Patched, `vllm.mod` builds the config and
# takes the helper's arguments.
FAILING_FIRST = """
def test_meets_the_platform_first():
    from vllm.mod import build_config
    build_config()
    assert False, "the behaviour the probe names"

def test_helper_fails_first():
    from vllm.mod import add_request
    add_request("req", [1], {}, (0,), True)
    assert False, "the behaviour the probe names"

def test_did_not_raise():
    import pytest
    with pytest.raises(ValueError):
        pass

def test_distinct_assertions():
    # As Hypothesis reports a property's distinct failures.
    raise ExceptionGroup("2 distinct failures", [AssertionError(), AssertionError()])

def test_group_with_an_error():
    raise ExceptionGroup("2 distinct failures", [AssertionError(), TypeError()])
"""
PATCHED_MOD = """VALUE = "patched"
def build_config():
    return {}
def add_request(request_id, block_ids, params, computed=(), awaiting=False):
    return None
"""
ORIGINAL_MOD = """VALUE = "original"
def build_config():
    raise RuntimeError("vLLM's CPU platform needs triton-cpu on this host")
def add_request(request_id, block_ids, params):
    return None
"""


@pytest.fixture
def installed(pytester, monkeypatch, tmp_path):
    """A patched `vllm` on the path, its manifest, and the pristine source
    wheel in the cache."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "mod.py").write_text(PATCHED_MOD)
    cache = tmp_path / "cache"
    source = cache / "wheels" / "vllm-9.9.0-py3-none-any.whl"
    source.parent.mkdir(parents=True)
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
        archive.writestr("vllm/mod.py", ORIGINAL_MOD)
    manifest = {
        "format": 1,
        "release": "9.9.0",
        "source": {"filename": source.name, "sha256": sha256_file(source)},
        "patches": [{"name": "p.patch", "files": ["vllm/mod.py"]}],
    }
    (site / "vllm" / "_overlay_series.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(cache))
    pytester.makepyfile(test_probes=PROBES)
    return source


def test_verdicts_are_inverted_on_the_unpatched_sources(pytester, installed):
    result = pytester.runpytest_subprocess("-p", "vllm_overlay.testing.unpatched")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*probes run against UNPATCHED vLLM 9.9.0 sources*",
            "*test_weak_probe passes on unpatched vLLM 9.9.0: the probe does not*",
        ]
    )


def test_pristine_keeps_the_raw_verdicts(pytester, installed):
    result = pytester.runpytest_subprocess("-p", "vllm_overlay.testing.pristine")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*FAILED*test_sees_the_patch*"])


def test_without_the_plugin_the_patched_module_is_seen(pytester, installed):
    pytester.runpytest_subprocess().assert_outcomes(passed=2)


def test_refuses_when_the_source_wheel_is_not_verified(pytester, installed):
    installed.write_bytes(installed.read_bytes() + b"tampered")
    result = pytester.runpytest_subprocess("-p", "vllm_overlay.testing.unpatched")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*source wheel vllm-9.9.0-py3-none-any.whl is not*"])


def test_refuses_an_unpatched_install(pytester, installed, tmp_path):
    (tmp_path / "site" / "vllm" / "_overlay_series.json").unlink()
    result = pytester.runpytest_subprocess("-p", "vllm_overlay.testing.unpatched")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*carries no vllm-overlay series*"])


def test_a_failure_outside_the_assertion_is_inconclusive(pytester, installed):
    """A probe that fails on the unpatched sources with an error outside its
    assertion proves nothing: the inverted run fails it, naming the error,
    instead of counting it as still needed; an assertion that failed (a
    plain `assert`, or pytest.raises' "DID NOT RAISE") still counts."""
    pytester.makepyfile(test_failing_first=FAILING_FIRST)
    result = pytester.runpytest_subprocess(
        "-p", "vllm_overlay.testing.unpatched", "test_failing_first.py"
    )
    result.assert_outcomes(passed=2, failed=3)
    result.stdout.fnmatch_lines(
        [
            "*test_meets_the_platform_first failed outside its assertion "
            "(RuntimeError) on unpatched vLLM 9.9.0: inconclusive*",
            "*test_helper_fails_first failed outside its assertion (TypeError)*",
            "*test_group_with_an_error failed outside its assertion (TypeError)*",
        ]
    )


def test_pristine_marks_a_failure_outside_the_assertion(pytester, installed):
    """The raw run (`status --probe`) keeps the failures, and marks in its
    JUnit report those outside the assertion, with the exception's type."""
    pytester.makepyfile(test_failing_first=FAILING_FIRST)
    report = pytester.path / "report.xml"
    result = pytester.runpytest_subprocess(
        "-p",
        "vllm_overlay.testing.pristine",
        "--junit-xml",
        str(report),
        "test_failing_first.py",
    )
    result.assert_outcomes(failed=5)
    probes = [
        f"test_failing_first.py::{name}"
        for name in (
            "test_meets_the_platform_first",
            "test_helper_fails_first",
            "test_did_not_raise",
            "test_distinct_assertions",
            "test_group_with_an_error",
        )
    ]
    assert probe_outcomes(probes, report) == dict(
        zip(
            probes,
            [
                "failed outside its assertion (RuntimeError)",
                "failed outside its assertion (TypeError)",
                "failed",
                "failed",
                "failed outside its assertion (TypeError)",
            ],
            strict=True,
        )
    )
