"""`.github/workflows/release.yml` cannot run here, so its shape is checked:
it builds every pinned release from every pinned distribution on every
pinned architecture, makes an image of every release pinned from `vllm`,
and attaches what the issue asks (SBOM, sums, attestations, the index on
Pages). The pins are read from releases.toml, never listed here."""

import re
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from vllm_overlay.arguments import build_parser
from vllm_overlay.locations import REPO_ROOT
from vllm_overlay.series.loader import pinned_releases
from vllm_overlay.series.pins import Dist

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "release.yml"
BUILD = re.compile(r"^\s*tools/apply\.sh (\S+) --dist (\S+)\s*$", re.MULTILINE)
# The architecture of a wheel's platform tag, and of a hosted runner's label.
ARCH = re.compile(r"_(x86_64|aarch64)$")


def load(path: Path) -> dict:
    workflow = yaml.safe_load(path.read_text(encoding="utf-8"))
    # YAML 1.1 reads the key `on` as true.
    workflow["on"] = workflow.pop(True, workflow.get("on"))
    return workflow


def runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def uses(job: dict) -> list[str]:
    return [step["uses"].split("@")[0] for step in job["steps"] if "uses" in step]


def pinned_builds() -> set[tuple[str, str]]:
    return {
        (version, str(wheel.dist))
        for version, pin in pinned_releases(REPO_ROOT / "patches").items()
        for wheel in pin.wheels
    }


def pinned_arches() -> set[str]:
    return {
        match[1]
        for pin in pinned_releases(REPO_ROOT / "patches").values()
        for wheel in pin.wheels
        for tag in wheel.tags
        if (match := ARCH.search(tag.platform))
    }


def runner_arch(label: str) -> str:
    return "aarch64" if label.endswith("-arm") else "x86_64"


def problems(workflow: dict) -> list[str]:
    """What the workflow leaves out of the pins, or of what it must attach."""
    found = []
    triggers = workflow["on"]
    if "workflow_dispatch" not in triggers or "tags" not in triggers.get("push", {}):
        found.append("runs on neither a tag push nor workflow_dispatch")
    jobs = workflow["jobs"]
    built = set(BUILD.findall(runs(jobs["wheels"])))
    for release, dist in sorted(pinned_builds() - built):
        found.append(f"does not build {release} from {dist}")
    for release, dist in sorted(built - pinned_builds()):
        found.append(f"builds {release} from {dist}, which is not pinned")
    arches = {runner_arch(r) for r in jobs["wheels"]["strategy"]["matrix"]["runner"]}
    found += [f"builds no {arch} wheel" for arch in sorted(pinned_arches() - arches)]
    images = set(jobs["images"]["strategy"]["matrix"]["release"])
    from_vllm = {release for release, dist in pinned_builds() if dist == Dist.VLLM}
    found += [f"makes no image of {r}" for r in sorted(from_vllm - images)]
    found += [f"makes an image of unpinned {r}" for r in sorted(images - from_vllm)]
    if not re.search(r"cyclonedx-bom==\d+(\.\d+)+\b", runs(jobs["wheels"])):
        found.append("installs no pinned cyclonedx-bom")
    for job, action in [
        ("wheels", "actions/attest-build-provenance"),
        ("publish", "actions/attest-build-provenance"),
        ("images", "actions/attest-build-provenance"),
        ("publish", "actions/upload-pages-artifact"),
        ("pages", "actions/deploy-pages"),
        ("images", "docker/build-push-action"),
    ]:
        if action not in uses(jobs[job]):
            found.append(f"job {job} does not use {action}")
    if not re.search(
        r"\bvllm-overlay index release/dist site\b", runs(jobs["publish"])
    ):
        found.append("writes no index with vllm-overlay index")
    if "gh release view" not in runs(jobs["publish"]):
        found.append("does not check that the release's assets kept their names")
    return found


def test_the_release_workflow_builds_every_pin_and_attaches_everything():
    assert problems(load(WORKFLOW)) == []


def test_a_release_left_out_is_caught(tmp_path):
    text = WORKFLOW.read_text(encoding="utf-8")
    newest = max(pinned_releases(REPO_ROOT / "patches"), key=Version)
    line = re.compile(rf"^ *tools/apply\.sh {re.escape(newest)} --dist vllm\n", re.M)
    left_out = line.sub("", text).replace(f'"{newest}"]', "]")
    workflow = tmp_path / "release.yml"
    workflow.write_text(left_out)
    assert problems(load(workflow)) == [
        f"does not build {newest} from vllm",
        f"makes no image of {newest}",
    ]


def test_an_unchecked_asset_name_is_caught(tmp_path):
    """GitHub may rename an asset (a `+` of a local version), which the
    index links by the name it was sent with: the workflow must compare."""
    text = WORKFLOW.read_text(encoding="utf-8")
    step = re.escape("      - name: Every asset kept the name the index links\n")
    unchecked = re.sub(step + r"(.*\n)*?(?=      - )", "", text)
    assert unchecked != text
    workflow = tmp_path / "release.yml"
    workflow.write_text(unchecked)
    assert problems(load(workflow)) == [
        "does not check that the release's assets kept their names"
    ]


def test_an_unpinned_build_and_a_missing_platform_are_caught(tmp_path):
    text = WORKFLOW.read_text(encoding="utf-8")
    build = "          tools/apply.sh {} --dist vllm\n"
    changed = text.replace(
        build.format("0.33.0"), build.format("0.33.0") + build.format("0.9.0")
    ).replace("runner: [ubuntu-24.04, ubuntu-24.04-arm]", "runner: [ubuntu-24.04]")
    workflow = tmp_path / "release.yml"
    workflow.write_text(changed)
    assert problems(load(workflow)) == [
        "builds 0.9.0 from vllm, which is not pinned",
        "builds no aarch64 wheel",
    ]


@pytest.mark.parametrize("line", BUILD.findall(WORKFLOW.read_text(encoding="utf-8")))
def test_each_build_line_is_a_valid_build_command(line):
    release, dist = line
    args = build_parser().parse_args(["build", release, "--dist", dist])
    assert (args.release, args.dist) == (release, dist)
