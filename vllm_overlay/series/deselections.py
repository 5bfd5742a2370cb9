"""Tests a release's build does not run, and why: `ci/suites/deselected.toml`
(upstream's tests) and `tests/deselected.toml` (ours), one loader for both.

Each `[[deselect]]` entry names a range of releases, `since` and `until`
(inclusive, either optional), rather than a list: a release pinned later falls
inside or outside every range by its version alone, so pinning one edits only
the entries whose range must change. The bounds are versions, pinned or not.
"""

from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.toml_files import read_toml

# The file of upstream's tests, relative to the repository root; ours is
# tests/deselected.toml.
UPSTREAM_DESELECTIONS_FILE = Path("ci") / "suites" / "deselected.toml"
OUR_DESELECTIONS_FILE = Path("tests") / "deselected.toml"
_KEYS = {"test", "since", "until", "reason"}


@dataclass(frozen=True)
class Deselection:
    """One test (`::` in `target`) or file or directory not run on the
    releases from `since` to `until` (inclusive; None: unbounded), and why."""

    target: str
    since: Version | None
    until: Version | None
    reason: str

    def applies_to(self, release: str) -> bool:
        version = Version(release)
        return (self.since is None or self.since <= version) and (
            self.until is None or version <= self.until
        )

    @property
    def whole_file(self) -> bool:
        """A file or directory left out of collection, not one test."""
        return "::" not in self.target

    def covers(self, path: str) -> bool:
        """`path` (a file or directory) is the target or lies in it."""
        return within(path, self.target)

    @property
    def pytest_args(self) -> list[str]:
        flag = "--ignore" if self.whole_file else "--deselect"
        return [f"{flag}={self.target}"]

    @property
    def span(self) -> str:
        """The range in words, for messages."""
        if self.since and self.until:
            if self.since == self.until:
                return str(self.since)
            return f"{self.since} to {self.until}"
        if self.since:
            return f"{self.since} and later"
        if self.until:
            return f"up to {self.until}"
        return "every release"


def within(path: str, root: str) -> bool:
    """`path` is `root` or lies in it (paths relative to one tree, a
    directory written with or without its trailing slash)."""
    path, root = path.rstrip("/"), root.rstrip("/")
    return path == root or path.startswith(f"{root}/")


def load_deselections(path: Path) -> list[Deselection]:
    """Parse and validate a deselection file: each `[[deselect]]` entry names
    a `test` (node id, or a file or directory to ignore), a non-empty
    `reason`, and optionally the `since` and `until` releases it applies
    between (inclusive)."""
    data = read_toml(path, "deselection file")
    entries = data.get("deselect", [])
    if not isinstance(entries, list):
        raise OverlayError(f"{path}: `deselect` must be an array of tables")
    return [_deselection(path, index, entry) for index, entry in enumerate(entries)]


def _deselection(path: Path, index: int, entry: object) -> Deselection:
    where = f"{path}: deselect entry {index + 1}"
    if isinstance(entry, dict) and "releases" in entry:
        raise OverlayError(
            f"{where}: `releases` lists releases one by one; name the range "
            "instead, with `since` and/or `until` (inclusive)"
        )
    if (
        not isinstance(entry, dict)
        or not {"test", "reason"} <= set(entry)
        or not set(entry) <= _KEYS
    ):
        raise OverlayError(
            f"{where} needs `test` and `reason`, and only `since` and `until` besides"
        )
    test, reason = entry["test"], entry["reason"]
    if not isinstance(test, str) or not test.startswith("tests/"):
        raise OverlayError(f"{where}: `test` must be a path under tests/")
    if not isinstance(reason, str) or not reason.strip():
        raise OverlayError(f"{where}: `reason` must say why")
    since, until = (_bound(where, key, entry.get(key)) for key in ("since", "until"))
    if since and until and since > until:
        raise OverlayError(f"{where}: `since` {since} is after `until` {until}")
    return Deselection(test, since, until, " ".join(reason.split()))


def _bound(where: str, key: str, value: object) -> Version | None:
    return None if value is None else release_version(where, key, value)


def release_version(where: str, key: str, value: object) -> Version:
    """`value`, the release `key` of `where` names, as a version, or a
    one-line error naming them."""
    try:
        if isinstance(value, str):
            return Version(value)
    except InvalidVersion:
        pass
    raise OverlayError(f"{where}: `{key}` must be a release version")


def deselected_on(path: Path, release: str) -> list[Deselection]:
    """The entries of the deselection file `path` that apply to `release`."""
    return [d for d in load_deselections(path) if d.applies_to(release)]
