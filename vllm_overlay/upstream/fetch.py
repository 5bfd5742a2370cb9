"""Download pinned upstream artifacts into the cache and verify them.

Downloads go through pip, so the user's index configuration (mirrors, proxies,
certificates) applies unchanged. pip runs in hash-checking mode with the pinned
sha256, and the file is hashed again before it enters the cache: a cached file
is trusted only while its hash still matches the pin.
"""

import hashlib
import os
import pty
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locking import exclusive
from vllm_overlay.series.pins import Dist, ReleasePin

_SDIST_MARKER = ".vllm-overlay-sdist-sha256"
_UNREACHABLE = (
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Connection refused",
    "Max retries exceeded",
)
_NOT_FOUND = ("No matching distribution found", "Could not find a version")
# pip's diagnostic code for a failed metadata step (pip/_internal/exceptions.py,
# `MetadataGenerationFailed`). pip prepares metadata only once the archive is
# unpacked whole, so this failure is the one that leaves a complete tree.
_METADATA_FAILED = "metadata-generation-failed"


def sha256_of(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


# What reading a damaged wheel raises: at opening (a missing or truncated
# central directory), or at reading a member (a bad CRC or deflate stream).
UNREADABLE = (zipfile.BadZipFile, zlib.error, EOFError, OSError)


def unreadable_wheel(wheel: Path, why: object) -> OverlayError:
    """The one error for a wheel that cannot be read."""
    return OverlayError(
        f"{wheel} is not a readable wheel (corrupted or truncated?): {why}"
    )


def open_wheel(wheel: Path) -> zipfile.ZipFile:
    """The wheel as an open archive, or `unreadable_wheel`."""
    try:
        return zipfile.ZipFile(wheel)
    except UNREADABLE as exc:
        raise unreadable_wheel(wheel, exc) from None


def wheel_members(wheel: Path, names: Iterable[str]) -> dict[str, bytes]:
    """The bytes of those of `names` the wheel holds (a file a patch creates
    is absent upstream)."""
    with open_wheel(wheel) as archive:
        present = set(archive.namelist())
        try:
            return {name: archive.read(name) for name in names if name in present}
        except UNREADABLE as exc:
            raise unreadable_wheel(wheel, exc) from None


def wheel_names(wheel: Path) -> list[str]:
    """The names of every member of the wheel, as `wheel_members` reads it."""
    with open_wheel(wheel) as archive:
        return archive.namelist()


@dataclass(frozen=True)
class SourceWheel:
    """A verified upstream wheel: its path, sha256 and distribution name."""

    path: Path
    sha256: str
    dist: Dist


def fetch_wheel(release: ReleasePin, dist: Dist, cache: Path) -> SourceWheel:
    """The release's pinned `dist` wheel that installs here, from the cache
    or downloaded into it; always verified."""
    wheel = release.wheel_for(dist)
    target = cache_layout.wheels(cache) / wheel.filename
    with exclusive(cache_layout.wheels(cache)):
        if target.exists():
            if sha256_of(target) == wheel.sha256:
                return SourceWheel(target, wheel.sha256, dist)
            print(
                f"vllm-overlay: cached {target} does not match its pinned sha256; "
                "downloading it again",
                file=sys.stderr,
            )
            target.unlink()
        requirement = f"{wheel.dist}=={release.version}"
        print(f"vllm-overlay: downloading {wheel.filename}", file=sys.stderr)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
            failure = pip_download(
                requirement,
                Path(tmp),
                ["--only-binary", ":all:", "-d", str(Path(tmp) / "out")],
                wheel.sha256,
                progress=on_terminal(),
            ).failure()
            if failure:
                raise OverlayError(failure)
            got = Path(tmp) / "out" / wheel.filename
            if not got.is_file():
                raise OverlayError(
                    f"pip did not produce {wheel.filename} for {requirement}"
                )
            _check_hash(got, wheel.sha256, wheel.filename)
            os.replace(got, target)
    return SourceWheel(target, wheel.sha256, dist)


def cached_sdist_tree(release: ReleasePin, cache: Path) -> Path | None:
    """The unpacked tree of the release's pinned sdist if the cache holds it
    whole (its marker, written last, names the pinned sha256), else None;
    never downloads."""
    target = cache_layout.sdist_tree(cache, release.version)
    marker = target / _SDIST_MARKER
    if marker.is_file() and marker.read_text().strip() == release.sdist.sha256:
        return target
    return None


def fetch_sdist_tree(release: ReleasePin, cache: Path) -> Path:
    """The unpacked source tree of the release's pinned sdist (with upstream's
    tests), from the cache or downloaded and unpacked into it.

    pip verifies the archive against the pin before unpacking it, then fails at
    the metadata step (vLLM's build needs CUDA tooling): that failure is
    expected, and the unpacked tree it leaves behind is what we keep.
    """
    target = cache_layout.sdist_tree(cache, release.version)
    marker = target / _SDIST_MARKER
    sha256 = release.sdist.sha256
    with exclusive(cache_layout.sources(cache)):
        if cached_sdist_tree(release, cache) is not None:
            return target
        shutil.rmtree(target, ignore_errors=True)
        print(f"vllm-overlay: downloading {release.sdist.filename}", file=sys.stderr)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
            run = pip_download(
                f"vllm=={release.version}",
                Path(tmp),
                [
                    "--no-binary",
                    ":all:",
                    "--no-build-isolation",
                    "--no-clean",
                    "-d",
                    str(Path(tmp) / "out"),
                ],
                sha256,
            )
            if not run.unpacked_whole:
                raise OverlayError(
                    run.failure() or f"pip did not unpack {release.sdist.filename}"
                )
            trees = sorted(Path(tmp).glob("pip-download-*/vllm_*"))
            if len(trees) != 1 or not (trees[0] / "PKG-INFO").is_file():
                raise OverlayError(f"pip did not unpack {release.sdist.filename}")
            if f"\nVersion: {release.version}\n" not in (
                trees[0] / "PKG-INFO"
            ).read_text(encoding="utf-8", errors="replace"):
                raise OverlayError(
                    f"{release.sdist.filename} unpacked to another version"
                )
            os.replace(trees[0], target)
        marker.write_text(sha256 + "\n")
    return target


@dataclass(frozen=True)
class PipRun:
    """What one `pip download` did: its exit status and its whole output."""

    requirement: str
    returncode: int
    output: str

    @property
    def unreachable(self) -> bool:
        """Whether pip could not reach the package index at all."""
        return any(hint in self.output for hint in _UNREACHABLE)

    @property
    def not_found(self) -> bool:
        """Whether the index (or a mirror) had no file that fits."""
        return any(hint in self.output for hint in _NOT_FOUND)

    @property
    def unpacked_whole(self) -> bool:
        """Whether pip got past unpacking an sdist: it succeeded, or only its
        metadata step failed. Any other failure (a full disk, a broken
        download) may leave a partial tree that must not be kept."""
        return self.returncode == 0 or _METADATA_FAILED in self.output

    def failure(self) -> str | None:
        """None when pip succeeded, else one line saying why it did not."""
        if self.returncode == 0:
            return None
        last = last_error_line(self.output)
        if self.unreachable or self.not_found:
            return (
                f"cannot download {self.requirement} and the cache has no copy "
                f"(is the package index reachable?): {last}"
            )
        return f"pip could not download {self.requirement}: {last}"


def pip_download(
    requirement: str,
    workdir: Path,
    options: Sequence[str],
    sha256: str | None = None,
    *,
    hash_checking: bool = False,
    progress: bool = False,
) -> PipRun:
    """Run `pip download --no-deps` for one requirement, its temporary files
    in `workdir` (pip leaves an unpacked sdist there with `--no-clean`).

    With `sha256`, pip runs in hash-checking mode against it, and a mismatch
    raises at once. `hash_checking` without a hash is how a file's sha256 is
    learned when pip cannot keep the file (an sdist whose metadata step
    fails): pip downloads it, hashes it and reports the hash, keeping nothing.
    With `progress` (a wheel download, where stderr is a terminal: see
    `on_terminal`), pip's output, its progress bar included, is shown as it
    runs; otherwise pip runs quiet, as in CI.
    """
    checking = sha256 is not None or hash_checking
    line = requirement + (f" --hash=sha256:{sha256}" if sha256 else "")
    requirements = workdir / "requirements.txt"
    requirements.write_text(line + "\n")
    command = [
        *(sys.executable, "-m", "pip", "download", "--no-deps"),
        *("--progress-bar", "on" if progress else "off"),
        *(["--require-hashes"] if checking else []),
        *("-r", str(requirements)),
        *options,
    ]
    env = dict(os.environ, TMPDIR=str(workdir))
    returncode, output = (
        shown_run(command, env) if progress else quiet_run(command, env)
    )
    run = PipRun(requirement, returncode, output)
    if sha256 and "DO NOT MATCH THE HASHES" in run.output:
        raise OverlayError(
            f"{requirement}: the downloaded file does not match the pinned sha256 "
            f"{sha256}; refusing to use it"
        )
    return run


def on_terminal() -> bool:
    """Whether a download may show its progress: stderr is a terminal."""
    return sys.stderr.isatty()


def quiet_run(command: Sequence[str], env: dict[str, str]) -> tuple[int, str]:
    """`command`'s exit status and whole output, nothing shown."""
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def shown_run(command: Sequence[str], env: dict[str, str]) -> tuple[int, str]:
    """`command`'s exit status and whole output, shown on stderr as it runs.

    pip draws its progress bar only on a terminal, so it gets a
    pseudo-terminal, whose output is echoed and kept; the kept text has the
    bar's redraws and any terminal escapes removed, as `PipRun` reads it."""
    controller, terminal = pty.openpty()
    chunks = []
    try:
        with subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=terminal,
            stderr=terminal,
            env=dict(env, NO_COLOR="1"),
        ) as proc:
            os.close(terminal)
            terminal = -1
            while chunk := _read(controller):
                chunks.append(chunk)
                sys.stderr.buffer.write(chunk)
                sys.stderr.flush()
    finally:
        os.close(controller)
        if terminal != -1:
            os.close(terminal)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    # A terminal ends each line with CR LF; a CR inside one is a redraw.
    lines = [
        line.rstrip("\r").rsplit("\r", 1)[-1]
        for line in _ESCAPES.sub("", text).split("\n")
    ]
    return proc.returncode, "\n".join(lines)


_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")


def _read(controller: int) -> bytes:
    """The next output of a pseudo-terminal; empty once its last writer
    closed it (Linux answers EIO then)."""
    try:
        return os.read(controller, 65536)
    except OSError:
        return b""


def last_error_line(output: str) -> str:
    """The line of pip's output that says why it failed: its last `ERROR`
    line, unless that only announces a traceback ("ERROR: Exception:"),
    whose last line is the reason (a full disk, a dropped connection)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    if errors and errors[-1] == "ERROR: Exception:":
        return lines[-1]
    return (errors or lines or ["no output"])[-1]


def _check_hash(path: Path, expected: str, name: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise OverlayError(
            f"{name}: sha256 {actual} does not match the pinned {expected}"
        )
