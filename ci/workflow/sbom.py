"""A CycloneDX SBOM per patched wheel, for the release's assets.

Usage:
    python -m ci.workflow.sbom DIST_DIR OUT_DIR   # OUT_DIR/<wheel>.cdx.json each

The SBOM's subject (`metadata.component`) is the wheel itself: its name,
version, purl and sha256. Its components are the requirements its METADATA
declares (`Requires-Dist`, every platform's; those of an extra left out),
each with its purl and, in a property, the requirement as declared with its
marker: the versions are pip's to resolve when a user installs the wheel,
the same as for upstream's wheel of the release, so none is claimed. The
dependency graph says the wheel depends on each of them. Written with
cyclonedx-python-lib (pinned in the dev extra), in CycloneDX 1.6 JSON.
"""

import argparse
import sys
from pathlib import Path

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from ci.envs.requirements import read_wheel
from vllm_overlay.common.errors import OverlayError, report_error

SUFFIX = ".cdx.json"
REQUIREMENT_PROPERTY = "vllm-overlay:requirement"


def wheel_sbom(wheel: Path) -> str:
    """The SBOM of `wheel`, as JSON text."""
    info = read_wheel(wheel)
    project, version, _, _ = parse_wheel_filename(wheel.name)
    subject = Component(
        type=ComponentType.LIBRARY,
        name=project,
        version=str(version),
        purl=PackageURL(type="pypi", name=project, version=str(version)),
        bom_ref=f"{project}=={version}",
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=info.sha256)],
    )
    bom = Bom()
    bom.metadata.component = subject
    declared: dict[str, list[str]] = {}
    for line in info.requires:
        requirement = Requirement(line)
        if requirement.marker is not None and "extra" in str(requirement.marker):
            continue
        declared.setdefault(canonicalize_name(requirement.name), []).append(line)
    dependencies = [
        Component(
            type=ComponentType.LIBRARY,
            name=name,
            purl=PackageURL(type="pypi", name=name),
            bom_ref=name,
            properties=[Property(name=REQUIREMENT_PROPERTY, value=v) for v in lines],
        )
        for name, lines in sorted(declared.items())
    ]
    for dependency in dependencies:
        bom.components.add(dependency)
    bom.register_dependency(subject, dependencies)
    return JsonV1Dot6(bom).output_as_string(indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.workflow.sbom", description=__doc__.split("\n")[0]
    )
    parser.add_argument("dist", type=Path, help="the folder of patched wheels")
    parser.add_argument("out", type=Path, help="the folder the SBOMs go into")
    args = parser.parse_args(argv)
    try:
        wheels = sorted(args.dist.glob("*.whl"))
        if not wheels:
            raise OverlayError(f"{args.dist} holds no wheel")
        args.out.mkdir(parents=True, exist_ok=True)
        for wheel in wheels:
            (args.out / f"{wheel.name}{SUFFIX}").write_text(
                wheel_sbom(wheel), encoding="utf-8"
            )
    except OverlayError as exc:
        report_error(exc)
        return 1
    print(f"{len(wheels)} SBOM(s) in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
