"""`vllm-overlay pin`: a release's artifacts, and the series its revision names.

`pin RELEASE` asks the package index, through pip (so the user's mirrors,
proxies and certificates apply), for the release's sdist and for the wheels of
each distribution on each architecture we pin, and adds the release's table,
every file with its sha256, to the pins file. `pin --bump RELEASE` records the
release's series (`Series.digest`) next to its `revision`, incrementing the
revision when the recorded series has changed since: `lint` fails while a
series is not the one its revision was recorded for, so two different patched
builds never share a version.

The pins file is rewritten one release table at a time, each rendered by
`tomli_w`: every other release keeps its text byte for byte (comments
included), and the result is parsed back and checked before it replaces the
file in one rename.

A new release's test environment would take pip's newest of every package its
requirements leave open, and a newer transformers than a release knew has
broken one before (`PixtralRotaryEmbedding`: 39 upstream failures on 0.30.0,
a rebuild to fix). So `pin` also decides, in the release facts, which
packages its environment takes at the version the release's own test
requirements pin (`[test_env.pinned_as_tested]`): every package a pinned
release takes so, the ones known to move past a release, recorded for the new
release beside the others and announced, for the maintainer to keep or remove
before committing. `ci/envs/release.py` says when an environment still
resolved one of them to another version than the release was tested with.
"""

import json
import os
import re
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomli_w
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from vllm_overlay.common import atomic, cache_layout
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.git import git_run
from vllm_overlay.common.locations import PINS_FILE, cache_root, patches_root
from vllm_overlay.common.locking import exclusive
from vllm_overlay.common.toml_entries import with_release_entry
from vllm_overlay.series.facts import (
    FACTS_FILE,
    as_releases_do,
    environment_facts,
)
from vllm_overlay.series.loader import load_series
from vllm_overlay.series.pins import (
    Dist,
    ReleasePin,
    load_pins,
    normalise_version,
    resolve_release,
)
from vllm_overlay.upstream.applier import syntax_problem
from vllm_overlay.upstream.fetch import (
    PipRun,
    last_error_line,
    on_terminal,
    pip_download,
    sha256_of,
)

# The machines the patched builds serve on; a wheel for any other platform is
# not pinned.
ARCHITECTURES = ("x86_64", "aarch64")
# The newest glibc whose manylinux tag is offered to pip (`manylinux_2_N`).
_NEWEST_GLIBC_MINOR = 40
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
_REPORTED_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
_RELEASE_HEADER = re.compile(r'^\[ *releases *\. *"([^"\\]+)" *\]', re.M)


def platform_tags(arch: str) -> list[str]:
    """The Linux platform tags of `arch`, best first, for pip's `--platform`.

    pip matches `--platform` tags exactly (it does not widen
    `manylinux_2_28_x86_64` to older glibc versions), so every manylinux tag
    is named, newest first, so that pip picks the wheel built for the newest
    glibc, as it would on such a machine.
    """
    tags = []
    for minor in range(_NEWEST_GLIBC_MINOR, 4, -1):
        tags.append(f"manylinux_2_{minor}_{arch}")
        if minor in _LEGACY_MANYLINUX:
            tags.append(f"{_LEGACY_MANYLINUX[minor]}_{arch}")
    return [*tags, f"linux_{arch}"]


def pin_release(
    version: str,
    dists: Sequence[str] = (),
    root: Path | None = None,
    cache: Path | None = None,
) -> ReleasePin:
    """Pin vLLM `version`: its sdist and the wheels of `dists` (default: every
    known distribution that has any), with revision 1 and no series yet.

    Every refusal comes before the pins file is touched. The wheels, hashed,
    go into the download cache, where `build` verifies them against the new
    pin instead of downloading them again.
    """
    root = root or patches_root()
    path = root / PINS_FILE
    version = normalise_version(version)
    pins = load_pins(path)
    pinned = next((v for v in pins if Version(v) == Version(version)), None)
    if pinned is not None:
        raise OverlayError(
            f"vLLM {pinned} is already pinned in {path}; after changing its "
            f"series, `vllm-overlay pin --bump {pinned}` records it"
        )
    as_tested = as_tested_record(root, version)
    cache = cache or cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".pin-") as tmp:
        sdist_sha256 = _sdist_sha256(version, Path(tmp) / "sdist")
        wheels = _download_wheels(version, dists, Path(tmp) / "wheels")
        table = {
            "revision": 1,
            "sdist": {"filename": f"vllm-{version}.tar.gz", "sha256": sdist_sha256},
            "wheels": [
                {"dist": dist, "filename": wheel.name, "sha256": sha256}
                for dist, wheel, sha256 in wheels
            ],
        }
        pin = write_release(path, version, table)
        if as_tested is not None:
            atomic.write_text(root / FACTS_FILE, as_tested.text)
            print(as_tested.announcement, file=sys.stderr)
        with exclusive(cache_layout.wheels(cache)):
            for _, wheel, _ in wheels:
                os.replace(wheel, cache_layout.wheels(cache) / wheel.name)
    return pin


@dataclass(frozen=True)
class AsTestedRecord:
    """The packages a new release's test environment takes at its tested
    version, and the facts file's text with them recorded."""

    release: str
    names: tuple[str, ...]
    taken_by: tuple[str, ...]
    text: str
    # The facts file as the checkout names it, and the entry's line there.
    path: str
    line: int

    @property
    def announcement(self) -> str:
        """What `pin` says it decided, and where to change the decision."""
        names = ", ".join(self.names)
        return (
            f"vllm-overlay: vLLM {self.release}'s test environment takes {names} at "
            f"the version its own test requirements pin, "
            f"{as_releases_do(self.taken_by)}, not pip's newest: recorded in "
            f"{self.path}:{self.line} ([test_env.pinned_as_tested]); "
            "edit or remove that line before committing to decide otherwise"
        )


def as_tested_record(root: Path, version: str) -> AsTestedRecord | None:
    """What `pin` records for `version` in `[test_env.pinned_as_tested]`
    (see the module docstring), or None when no pinned release takes a
    package at its tested version. Read and rendered before anything is
    downloaded: a facts file `pin` cannot extend is refused, naming the line
    to add, before the pins file is touched.

    The entry goes into the table's text in release order (before the comment
    that opens the first later release's entry, else after the table's last
    line), so every other line keeps its bytes; the new text must parse to
    the old data plus that entry."""
    path = root / FACTS_FILE
    if not path.is_file():
        return None
    taken = environment_facts(root).pinned_as_tested
    names = tuple(sorted(set().union(*taken.values())))
    if not names:
        return None
    entry = f'"{version}" = [{", ".join(json.dumps(name) for name in names)}]'
    added = with_release_entry(
        path.read_text(encoding="utf-8"),
        "test_env.pinned_as_tested",
        version,
        entry,
        list(names),
        f"Recorded by `vllm-overlay pin {version}`.",
    )
    if added is None:
        raise OverlayError(
            f"cannot record {entry} in [test_env.pinned_as_tested] of {path}, "
            "which must be a table of one-line entries; make it one, then pin again"
        )
    new_text, line = added
    return AsTestedRecord(
        version,
        names,
        tuple(sorted((r for r, n in taken.items() if n), key=Version)),
        new_text,
        f"{root.name}/{FACTS_FILE.as_posix()}",
        line,
    )


def bump_release(version: str, root: Path | None = None) -> tuple[int, ReleasePin]:
    """Record the release's current series next to its revision: the old
    revision and the new pin (see `record_series`). An unchanged series is
    refused: there is nothing to bump."""
    root = root or patches_root()
    release = resolve_release(load_pins(root / PINS_FILE), version)
    if release.series_digest == load_series(root, release).digest:
        raise OverlayError(
            f"the series of vLLM {release.version} is unchanged since revision "
            f"{release.revision} was recorded; there is nothing to bump"
        )
    return release.revision, record_series(release.version, root)


def record_series(version: str, root: Path) -> ReleasePin:
    """Write the release's current series digest next to its revision; the
    new pin.

    The revision goes up by one when a recorded series has changed and a
    commit holds a series under that revision; otherwise the revision keeps
    its number: a series recorded for the first time has no recorded series
    to tell a change from (`rebase` writes a new release's first series under
    revision 1 and records it here), and fixing a series before committing it
    (a stale reference after `rebase`) must not take a revision no commit, so
    no build, ever had. A checkout whose commits git cannot read here counts
    the revision as committed.
    """
    path = root / PINS_FILE
    release = resolve_release(load_pins(path), version)
    series = load_series(root, release)
    unreadable = [
        problem for patch in series.patches if (problem := syntax_problem(patch.path))
    ]
    if unreadable:
        raise OverlayError(
            f"{unreadable[0]}; the series of vLLM {release.version} is not recorded"
        )
    if release.series_digest == series.digest:
        return release
    taken = release.series_digest and _committed_series_revision(root, release)
    revision = release.revision + 1 if taken else release.revision
    bumped = replace(series, release=replace(release, revision=revision))
    table = tomllib.loads(path.read_text(encoding="utf-8"))["releases"][release.version]
    table.update(revision=revision, series_digest=bumped.digest)
    return write_release(path, release.version, table)


def _committed_series_revision(root: Path, release: ReleasePin) -> bool:
    """Whether HEAD's pins file records a series under `release`'s revision
    (or a later one); True when git cannot tell (no work tree, no commit, a
    file that does not parse), so that the revision is then bumped."""
    try:
        shown = git_run(
            root, "show", f"HEAD:./{PINS_FILE.as_posix()}", user_config=True
        )
    except FileNotFoundError:
        return True
    if shown.returncode != 0:
        return True
    try:
        committed = tomllib.loads(shown.stdout).get("releases", {})
    except tomllib.TOMLDecodeError:
        return True
    table = committed.get(release.version)
    if not isinstance(table, dict) or "series_digest" not in table:
        return False
    revision = table.get("revision")
    return not isinstance(revision, int) or revision >= release.revision


def _sdist_sha256(version: str, workdir: Path) -> str:
    """The sha256 of the release's sdist, as pip computed it downloading it.

    vLLM's sdist cannot be built here (its metadata step needs CUDA tooling),
    so pip never keeps the archive; in hash-checking mode without a hash it
    still downloads it, hashes it and reports the hash, before that step.
    """
    workdir.mkdir()
    requirement = f"vllm=={version}"
    print(f"vllm-overlay: downloading {requirement} (sdist)", file=sys.stderr)
    run = pip_download(
        requirement,
        workdir,
        ["--no-binary", ":all:", "-d", str(workdir / "out")],
        hash_checking=True,
    )
    reported = _REPORTED_HASH.findall(run.output)
    if len(reported) == 1:
        return reported[0]
    last = last_error_line(run.output)
    if run.unreachable:
        raise _unreachable(version, run)
    if run.not_found:
        raise OverlayError(
            f"vLLM {version} has no sdist on the package index, so it cannot be "
            f"pinned ({last})"
        )
    raise OverlayError(f"pip reported no sha256 for the sdist of {requirement}: {last}")


def _download_wheels(
    version: str, dists: Sequence[str], workdir: Path
) -> list[tuple[str, Path, str]]:
    """(dist, downloaded wheel, sha256) for each wheel of the release pip
    finds for each of `ARCHITECTURES`, per distribution (every known one
    when `dists` is empty, which then need not all have wheels)."""
    found: dict[str, tuple[str, Path, str]] = {}
    for dist in dict.fromkeys(dists or Dist):
        for arch in ARCHITECTURES:
            wheel = _download_wheel(dist, version, arch, workdir / f"{dist}-{arch}")
            if wheel is not None:
                found.setdefault(wheel.name, (dist, wheel, sha256_of(wheel)))
        if dists and not any(entry[0] == dist for entry in found.values()):
            raise OverlayError(
                f"vLLM {version} has no {dist} wheel for {' or '.join(ARCHITECTURES)} "
                "on the package index"
            )
    if not found:
        raise OverlayError(
            f"vLLM {version} has no wheel of a known distribution "
            f"({', '.join(Dist)}) for {' or '.join(ARCHITECTURES)} on the "
            "package index"
        )
    return list(found.values())


def _download_wheel(dist: str, version: str, arch: str, workdir: Path) -> Path | None:
    """The wheel of `dist` `version` pip picks for `arch`, or None when the
    index has none. No sha256 is known yet, so this is not hash-checking mode;
    pip still checks the hash an index publishes with each file."""
    workdir.mkdir(parents=True)
    requirement = f"{dist}=={version}"
    print(f"vllm-overlay: downloading {requirement} for {arch}", file=sys.stderr)
    platforms = [arg for tag in platform_tags(arch) for arg in ("--platform", tag)]
    out = workdir / "out"
    run = pip_download(
        requirement,
        workdir,
        ["--only-binary", ":all:", *platforms, "-d", str(out)],
        progress=on_terminal(),
    )
    wheels = sorted(out.glob("*.whl"))
    if run.returncode == 0 and len(wheels) == 1:
        published = str(parse_wheel_filename(wheels[0].name)[1])
        if published != version:
            raise OverlayError(
                f"vLLM {version} is published as {published}; pin {published}"
            )
        return wheels[0]
    if run.unreachable:
        raise _unreachable(version, run)
    if run.not_found:
        return None
    raise OverlayError(
        run.failure() or f"pip did not produce one wheel for {requirement} on {arch}"
    )


def _unreachable(version: str, run: PipRun) -> OverlayError:
    return OverlayError(
        f"cannot pin vLLM {version}: the package index is not reachable "
        f"({last_error_line(run.output)})"
    )


def write_release(path: Path, version: str, table: dict[str, Any]) -> ReleasePin:
    """Put release `version`'s `table` into the pins file (replacing its old
    table, or adding it before the first newer release) and return its pin.

    Only that table is rendered (by `tomli_w`); the rest of the file keeps its
    bytes. The new text must parse to the old data with this one table
    changed and pass `load_pins`, else nothing is written.
    """
    text = path.read_text(encoding="utf-8")
    releases = tomllib.loads(text)["releases"]
    head, chunks = _release_chunks(path, text, releases)
    if version not in chunks:
        later = [v for v in chunks if Version(v) > Version(version)]
        at = list(chunks).index(later[0]) if later else len(chunks)
        items = list(chunks.items())
        chunks = dict([*items[:at], (version, ""), *items[at:]])
    chunks[version] = tomli_w.dumps({"releases": {version: table}})
    parts = list(chunks.values())
    new_text = head + "".join(
        part if n == len(parts) - 1 or part.endswith("\n\n") else part + "\n"
        for n, part in enumerate(parts)
    )
    if tomllib.loads(new_text) != {"releases": {**releases, version: table}}:
        raise OverlayError(f"{path}: rewriting release {version} changed other data")
    with atomic.replacing(path) as scratch:
        scratch.write_text(new_text, encoding="utf-8")
        pin = load_pins(scratch)[version]
    return pin


def _release_chunks(
    path: Path, text: str, releases: dict[str, Any]
) -> tuple[str, dict[str, str]]:
    """The file's text before the first release, and each release's text (from
    its `[releases."X"]` header to the next one), in file order.

    Each piece must parse on its own to exactly that release, and the head to
    nothing, so that keeping a piece's bytes keeps its data.
    """
    starts = [(m.start(), m.group(1)) for m in _RELEASE_HEADER.finditer(text)]
    bounds = [start for start, _ in starts] + [len(text)]
    head = text[: bounds[0]]
    chunks = {
        version: text[start:end]
        for (start, version), end in zip(starts, bounds[1:], strict=True)
    }
    faithful = (
        len(chunks) == len(starts)
        and chunks.keys() == releases.keys()
        and (_parses_to(head, {}) or _parses_to(head, {"releases": {}}))
        and all(
            _parses_to(chunk, {"releases": {v: releases[v]}})
            for v, chunk in chunks.items()
        )
    )
    if not faithful:
        raise OverlayError(
            f"{path}: cannot rewrite one release and keep the others' text: each "
            'release must be one [releases."X"] table with its sub-tables after it'
        )
    return head, chunks


def _parses_to(text: str, data: dict[str, Any]) -> bool:
    try:
        return tomllib.loads(text) == data
    except tomllib.TOMLDecodeError:
        return False
