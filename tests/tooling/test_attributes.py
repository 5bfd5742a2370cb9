"""`lint` names an attribute the series reads that its release defines
nowhere while another pinned release does (`track/checks/attributes.py`): what a
replay onto an older release merged without a conflict
(`connector_output.failed_recving`, a `KVConnectorOutput` field since
0.30.0) and only reading found."""

import json

from conftest import RELEASE, SCHEDULER, format_patch
from test_lint import cache_sources

from vllm_overlay.track.checks import attributes
from vllm_overlay.track.checks.attributes import (
    DEFINED_FILE,
    defined_names,
    missing_attributes,
    package_names,
)
from vllm_overlay.track.checks.lint import lint

MODULE = b"""
import os.path as osp
from dataclasses import dataclass, field
LIMIT = 3
def helper(arg):
    local_name = arg
    return local_name
@dataclass
class Output:
    failed_recving: set = field(default_factory=set)
    if LIMIT:
        guarded = 1
    def method(self):
        self.stored = 1
        return self.method_local
"""
OLDER = {"m.py": b"def f(out):\n    return out.finished\n"}
NEWER_NAMES = frozenset({"finished", "failed_recving", "done", "strip", "submit"})


def test_what_a_module_can_supply_as_an_attribute():
    assert defined_names(MODULE, "m.py") == {
        *("osp", "dataclass", "field", "LIMIT", "helper", "Output"),
        *("failed_recving", "guarded", "method", "stored"),
    }


def check(patched: bytes, defined=frozenset({"finished"})) -> list[str]:
    return missing_attributes(
        "9.8.0", OLDER, {"m.py": patched}, defined, {"9.9.0": NEWER_NAMES}
    )


def test_an_attribute_only_another_release_defines_is_named():
    patched = b"def f(out):\n    return out.finished, out.failed_recving\n"
    assert check(patched) == [
        "the series makes m.py read `.failed_recving` (defined in vLLM 9.9.0), "
        "which vLLM 9.8.0 defines nowhere: port the code onto 9.8.0's API (the "
        "same patch in the other releases' series shows how)"
    ]


def test_what_the_release_the_series_or_a_library_supplies_is_not_named():
    assert check(b"def f(out):\n    return out.failed_recving\n", NEWER_NAMES) == []
    # The series defines it itself, in this module or another it patches.
    stored = b"def f(out):\n    out.failed_recving = 1\n    return out.failed_recving\n"
    assert check(stored) == []
    # A builtin type's and an imported standard-library class's attribute,
    # which some vLLM release also happens to define.
    library = (
        b"from concurrent.futures import ThreadPoolExecutor\n"
        b"def f(pool, text):\n"
        b"    return pool.submit(text.strip).done()\n"
    )
    assert check(library) == []
    # A name no pinned release defines (another library's) is not judged.
    assert check(b"def f(tensor):\n    return tensor.numel()\n") == []


def test_a_read_the_unpatched_file_has_already_is_not_the_series(tmp_path):
    original = {"m.py": b"def f(out):\n    return out.failed_recving\n"}
    assert (
        missing_attributes(
            "9.8.0",
            original,
            {"m.py": original["m.py"] + b"# patched\n"},
            frozenset(),
            {"9.9.0": NEWER_NAMES},
        )
        == []
    )


def test_a_release_is_read_once_and_kept_beside_its_sources(tmp_path, monkeypatch):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "outputs.py").write_bytes(MODULE)
    names = package_names(tmp_path)
    assert "failed_recving" in names
    kept = json.loads((tmp_path / DEFINED_FILE).read_text())
    assert kept["names"] == sorted(names)
    (tmp_path / "vllm" / "outputs.py").write_bytes(b"")
    assert package_names(tmp_path) == names
    monkeypatch.setattr(attributes, "COLLECTOR", kept["collector"] + 1)
    assert package_names(tmp_path) == frozenset()


def test_lint_names_it_against_the_cached_sources(project):
    unpatched = "def f(out):\n    return out.finished\n"
    patched = "def f(out):\n    return out.finished, out.failed_recving\n"
    cache_sources(project, unpatched)
    newer = project.cache / "sources" / "vllm-9.10.0"
    (newer / "vllm").mkdir(parents=True)
    (newer / "vllm" / "outputs.py").write_text("class O:\n    failed_recving = 1\n")
    (newer / ".vllm-overlay-sdist-sha256").write_text("0" * 64 + "\n")
    project.pin_release("9.10.0", unpatched)
    patch = project.series_dir / "scheduler-demo.patch"
    patch.write_text(
        format_patch(project.workdir, {SCHEDULER: unpatched}, {SCHEDULER: patched})
    )
    assert [p for p in lint(project.patches) if "defines nowhere" in p] == [
        f"vLLM {RELEASE}: the series makes {SCHEDULER} read `.failed_recving` "
        f"(defined in vLLM 9.10.0), which vLLM {RELEASE} defines nowhere: port the "
        f"code onto {RELEASE}'s API (the same patch in the other releases' series "
        "shows how)"
    ]
