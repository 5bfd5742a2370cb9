"""The index over several releases: what the release workflow does on each
tag (`vllm-overlay index release/dist site --wheel-url URL --earlier DIR`,
with every published release's `wheels.json` saved in DIR as `<tag>.json`).

A user's exact pin of an earlier revision keeps resolving after the next
release replaces the index: pip itself resolves and downloads it over HTTP
from a server on 127.0.0.1 that holds the releases' assets as GitHub would,
each under its own tag's folder."""

import http.server
import json
import shutil
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import refusal, run_cli
from test_index import CPU_WHEEL, GPU_WHEEL, links_of, make_wheel, sha256

NEW_CPU_WHEEL = CPU_WHEEL.replace("hybridkv.3", "hybridkv.4")
BASE = "https://github.com/o/r/releases/download"


def publish(capsys, tmp_path: Path, tag: str, wheels: dict[str, Path], base: str):
    """Index `wheels` (file name -> the file to copy) as release `tag` whose
    assets are at `base/tag`, linking every listing saved so far in
    `tmp_path/earlier`; then save its listing there, as the workflow does."""
    dist = tmp_path / tag / "dist"
    dist.mkdir(parents=True)
    for name, source in wheels.items():
        shutil.copyfile(source, dist / name)
    earlier = tmp_path / "earlier"
    earlier.mkdir(exist_ok=True)
    site = tmp_path / tag / "site"
    argv = ("index", str(dist), str(site), "--wheel-url", f"{base}/{tag}")
    code, out, err = run_cli(capsys, *argv, "--earlier", str(earlier))
    assert code == 0, err
    assert out.endswith(f"and {site / 'SHA256SUMS'} and {site / 'wheels.json'}\n")
    shutil.copyfile(site / "wheels.json", earlier / f"{tag}.json")
    return site


@pytest.fixture
def built(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "built"
    return {
        CPU_WHEEL: make_wheel(folder, CPU_WHEEL, requires_python=">=3.10"),
        GPU_WHEEL: make_wheel(folder, GPU_WHEEL),
        NEW_CPU_WHEEL: make_wheel(folder, NEW_CPU_WHEEL),
    }


def test_every_published_revision_stays_linked(capsys, tmp_path, built):
    first = {CPU_WHEEL: built[CPU_WHEEL], GPU_WHEEL: built[GPU_WHEEL]}
    publish(capsys, tmp_path, "v0.2.0", first, BASE)
    # The next tag: a new revision of the CPU build; the GPU build unchanged,
    # the same bytes under the same name, published again as its asset.
    second = {NEW_CPU_WHEEL: built[NEW_CPU_WHEEL], GPU_WHEEL: built[GPU_WHEEL]}
    site = publish(capsys, tmp_path, "v0.10.0", second, BASE)

    hrefs = [href for href, _, _ in links_of(site / "simple" / "vllm" / "index.html")]
    assert hrefs == [
        f"{BASE}/v0.2.0/{quote(CPU_WHEEL)}#sha256={sha256(built[CPU_WHEEL])}",
        f"{BASE}/v0.10.0/{quote(NEW_CPU_WHEEL)}#sha256={sha256(built[NEW_CPU_WHEEL])}",
        # Kept at the link it was first published at.
        f"{BASE}/v0.2.0/{quote(GPU_WHEEL)}#sha256={sha256(built[GPU_WHEEL])}",
    ]
    requires = [r for _, r, _ in links_of(site / "simple" / "vllm" / "index.html")]
    assert requires == [">=3.10", None, None]
    # SHA256SUMS and the listing are of this release's assets only.
    assert (site / "SHA256SUMS").read_text().splitlines() == [
        f"{sha256(built[n])}  {n}" for n in sorted(second)
    ]
    listing = json.loads((site / "wheels.json").read_text())
    assert [w["url"] for w in listing["wheels"]] == [
        f"{BASE}/v0.10.0/{quote(n)}" for n in sorted(second)
    ]


def test_pip_resolves_an_earlier_revision_from_the_next_index(capsys, tmp_path, built):
    served = tmp_path / "served"
    served.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_port}/download"
        releases = {
            "v0.2.0": {CPU_WHEEL: built[CPU_WHEEL], GPU_WHEEL: built[GPU_WHEEL]},
            "v0.3.0": {NEW_CPU_WHEEL: built[NEW_CPU_WHEEL]},
        }
        for tag, wheels in releases.items():
            site = publish(capsys, tmp_path, tag, wheels, base)
            assets = served / "download" / tag
            shutil.copytree(tmp_path / tag / "dist", assets)
        shutil.copytree(site / "simple", served / "simple")
        index = f"http://127.0.0.1:{server.server_port}/simple"
        got = subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--no-deps"),
                *("--index-url", index, "--timeout", "10", "--retries", "0"),
                *("--dest", str(tmp_path / "got"), "vllm==0.32.0+cpu.hybridkv.3"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert got.returncode == 0, got.stderr
    assert [p.name for p in (tmp_path / "got").iterdir()] == [CPU_WHEEL]


def test_the_same_name_with_other_bytes_is_refused(capsys, tmp_path, built):
    publish(capsys, tmp_path, "v0.2.0", {CPU_WHEEL: built[CPU_WHEEL]}, BASE)
    rebuilt = make_wheel(tmp_path / "rebuilt", CPU_WHEEL, requires_python=">=3.11")
    dist = tmp_path / "v0.3.0" / "dist"
    dist.mkdir(parents=True)
    shutil.copyfile(rebuilt, dist / CPU_WHEEL)
    site = tmp_path / "v0.3.0" / "site"
    line = refusal(
        capsys,
        *("index", str(dist), str(site), "--wheel-url", f"{BASE}/v0.3.0"),
        *("--earlier", str(tmp_path / "earlier")),
    )
    assert line == (
        f"vllm-overlay: error: {CPU_WHEEL} was published at "
        f"{BASE}/v0.2.0/{quote(CPU_WHEEL)} with sha256 {sha256(built[CPU_WHEEL])}, "
        f"and {dist / CPU_WHEEL} has {sha256(rebuilt)}: one revision builds the "
        "same bytes, so the series changed without `vllm-overlay pin --bump`"
    )
    assert not site.exists()


GOOD_ENTRY = {
    "filename": GPU_WHEEL,
    "sha256": "a" * 64,
    "requires_python": None,
    "url": f"{BASE}/v0.2.0/{quote(GPU_WHEEL)}",
}
BAD_LISTINGS = {
    "not json": ("{", "is not a readable listing"),
    "another format": ({"format": 2, "wheels": []}, "is not a listing of format 1"),
    "a key missing": (
        {"format": 1, "wheels": [{"filename": GPU_WHEEL}]},
        "wheel 1 must have exactly",
    ),
    "a bad file name": (
        {"format": 1, "wheels": [dict(GOOD_ENTRY, filename="vllm.whl")]},
        "Invalid wheel filename",
    ),
    "a bad sha256": (
        {"format": 1, "wheels": [dict(GOOD_ENTRY, sha256="abc")]},
        "sha256 'abc' is not 64 hex digits",
    ),
    "a url elsewhere": (
        {"format": 1, "wheels": [dict(GOOD_ENTRY, url=f"{BASE}/v0.2.0/other.whl")]},
        "does not end in its file name",
    ),
    "a url that is no url": (
        {"format": 1, "wheels": [dict(GOOD_ENTRY, url="v0.2.0/x.whl")]},
        "is not an http(s) URL",
    ),
    "requires_python not text": (
        {"format": 1, "wheels": [dict(GOOD_ENTRY, requires_python=3)]},
        "requires_python must be text or null",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_LISTINGS))
def test_a_bad_listing_is_refused_in_one_line(capsys, tmp_path, built, case):
    content, says = BAD_LISTINGS[case]
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    text = content if isinstance(content, str) else json.dumps(content)
    (earlier / "v0.2.0.json").write_text(text)
    dist = tmp_path / "built"
    site = tmp_path / "site"
    line = refusal(
        capsys,
        *("index", str(dist), str(site), "--wheel-url", f"{BASE}/v0.3.0"),
        *("--earlier", str(earlier)),
    )
    assert says in line
    assert not site.exists()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: None, "does not exist; name the folder of earlier releases'"),
        (lambda d: d.write_text(""), "is not a folder"),
        (
            lambda d: (d.mkdir(), (d / "notes.txt").write_text("")),
            "notes.txt is not a listing",
        ),
    ],
)
def test_a_bad_folder_of_listings_is_refused(capsys, tmp_path, built, make, says):
    earlier = tmp_path / "earlier"
    make(earlier)
    line = refusal(
        capsys,
        *("index", str(tmp_path / "built"), str(tmp_path / "site")),
        *("--wheel-url", f"{BASE}/v0.3.0", "--earlier", str(earlier)),
    )
    assert says in line


def test_earlier_releases_need_a_wheel_url(capsys, tmp_path, built):
    (tmp_path / "earlier").mkdir()
    line = refusal(
        capsys,
        *("index", str(tmp_path / "built"), str(tmp_path / "site")),
        *("--earlier", str(tmp_path / "earlier")),
    )
    assert line.endswith(
        "--earlier needs --wheel-url: this release's listing "
        "must say where its wheels are hosted, as the earlier "
        "ones do"
    )
