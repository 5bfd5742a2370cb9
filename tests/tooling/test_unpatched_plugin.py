"""The plugins that serve the unpatched sources: `pristine` (raw verdicts) and
`unpatched` (inverted, to prove probes fail without their patches)."""

import json
import zipfile

import pytest
from conftest import sha256_file

PROBES = """
def test_sees_the_patch():
    from vllm.mod import VALUE
    assert VALUE == "patched"

def test_weak_probe():
    assert True
"""


@pytest.fixture
def installed(pytester, monkeypatch, tmp_path):
    """A patched `vllm` on the path, its manifest, and the pristine source
    wheel in the cache."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "mod.py").write_text('VALUE = "patched"\n')
    cache = tmp_path / "cache"
    source = cache / "wheels" / "vllm-9.9.0-py3-none-any.whl"
    source.parent.mkdir(parents=True)
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
        archive.writestr("vllm/mod.py", 'VALUE = "original"\n')
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
