"""`.github/workflows/release.yml` cannot run here, so its shape is checked:
it builds what `python -m ci.workflow.pinned` derives from releases.toml (every pinned
release from every pinned distribution, on every pinned architecture), makes
an image of every pinned release, and attaches what the issue asks (SBOM,
sums, attestations, the index on Pages). `ci.yml`'s GPU job takes its
releases from the pins too. No release is listed in a workflow or here."""

import json
import re
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from ci.workflow.pinned import builds_here, main, release_matrix
from vllm_overlay.common.locations import REPO_ROOT
from vllm_overlay.series.loader import pinned_releases

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "release.yml"
CI_WORKFLOW = REPO_ROOT / ".github" / "workflows" / "ci.yml"
PINNED_MATRIX = "${{ fromJSON(needs.pins.outputs.releases) }}"
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
    found += pins_job_problems(jobs)
    if not re.search(
        r"^\s*python -m ci\.workflow\.pinned build dist\s*$", runs(jobs["wheels"]), re.M
    ):
        found.append(
            "does not build the pinned wheels with `python -m ci.workflow.pinned build`"
        )
    arches = {runner_arch(r) for r in jobs["wheels"]["strategy"]["matrix"]["runner"]}
    found += [f"builds no {arch} wheel" for arch in sorted(pinned_arches() - arches)]
    found += matrix_problems(jobs["images"], "images")
    # The image matrix takes every pinned release: each needs a `vllm` wheel.
    found += [
        f"makes an image of {version}, which is not pinned from vllm"
        for version, pin in sorted(pinned_releases(REPO_ROOT / "patches").items())
        if not any(wheel.dist == "vllm" for wheel in pin.wheels)
    ]
    if "python -m ci.workflow.sbom dist sbom" not in runs(jobs["wheels"]):
        found.append("writes no SBOM with `python -m ci.workflow.sbom`")
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
    return found


def needs(job: dict) -> list[str]:
    said = job.get("needs", [])
    return [said] if isinstance(said, str) else said


# What the publish job runs, in this order: a draft, its assets downloaded
# back and checked, the attestations verified, and only then the release
# made public.
PUBLISH_ORDER = (
    "gh release create",
    "--draft",
    "python -m ci.workflow.release_assets",
    "gh attestation verify",
    "--draft=false",
)


def gate_problems(workflow: dict, ci: dict) -> list[str]:
    """A tag publishes only a commit of main whose suite passed, through a
    draft checked before it is public, and an index that forgets nothing."""
    jobs = workflow["jobs"]
    found = []
    if "workflow_call" not in ci["on"]:
        found.append("ci.yml cannot be called by the release workflow")
    on_main = jobs.get("on-main", {"steps": []})
    if "git merge-base --is-ancestor" not in runs(on_main):
        found.append("does not check that the tag's commit is on main")
    suite = jobs.get("suite", {})
    if suite.get("uses") != "./.github/workflows/ci.yml" or "on-main" not in needs(
        suite
    ):
        found.append("does not run ci.yml on the tag's commit once it is on main")
    cpu_runs = runs(ci["jobs"]["cpu"])
    if (suite.get("with") or {}).get("full") is not True or "--full" not in cpu_runs:
        found.append("does not run the full suite before publishing")
    if "suite" not in needs(jobs["wheels"]):
        found.append("builds before the suite passed")
    publish = runs(jobs["publish"])
    positions = [publish.find(text) for text in PUBLISH_ORDER]
    if -1 in positions or positions != sorted(positions):
        found.append("does not publish through a draft it checked first")
    if "--earlier earlier" not in publish:
        found.append("its index forgets the earlier releases")
    found += [
        f"job {name} does not wait for the release to be public"
        for name in ("pages", "images")
        if "publish" not in needs(jobs[name])
    ]
    return found


def gpu_problems(ci: dict) -> list[str]:
    """The GPU job runs only on a declared GPU runner, never a fork's code."""
    gpu = ci["jobs"]["gpu"]
    guard = " ".join(str(gpu.get("if", "")).split())
    found = []
    if gpu.get("runs-on") != "${{ fromJSON(vars.GPU_RUNNER_LABELS) }}" or (
        "vars.GPU_RUNNER_LABELS != ''" not in guard
    ):
        found.append("the GPU job does not wait for a declared GPU runner")
    if "github.event.pull_request.head.repo.full_name == github.repository" not in (
        guard
    ):
        found.append("the GPU job runs a fork's pull request")
    return found


def pins_job_problems(jobs: dict) -> list[str]:
    """The `pins` job the matrices read: it prints the pinned releases."""
    pins = jobs.get("pins")
    if pins is None:
        return ["has no pins job"]
    if "python -m ci.workflow.pinned releases" not in runs(pins):
        return ["its pins job does not run `python -m ci.workflow.pinned releases`"]
    return []


def matrix_problems(job: dict, name: str) -> list[str]:
    """A per-release job must take its releases from the pins job."""
    needs = job.get("needs", [])
    if job["strategy"]["matrix"]["release"] != PINNED_MATRIX or "pins" not in (
        [needs] if isinstance(needs, str) else needs
    ):
        return [f"job {name} lists its releases instead of reading the pins job"]
    return []


def test_the_release_workflow_builds_every_pin_and_attaches_everything():
    assert problems(load(WORKFLOW)) == []


def test_the_gpu_job_takes_every_pinned_release():
    jobs = load(CI_WORKFLOW)["jobs"]
    assert pins_job_problems(jobs) + matrix_problems(jobs["gpu"], "gpu") == []


def test_a_release_list_written_by_hand_is_caught(tmp_path):
    text = WORKFLOW.read_text(encoding="utf-8")
    listed = json.dumps(release_matrix(REPO_ROOT / "patches"))
    workflow = tmp_path / "release.yml"
    workflow.write_text(text.replace(PINNED_MATRIX, listed))
    assert problems(load(workflow)) == [
        "job images lists its releases instead of reading the pins job"
    ]


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_builds_are_every_pinned_wheel_of_the_platform(arch):
    pins = pinned_releases(REPO_ROOT / "patches")
    tags = {
        tag
        for pin in pins.values()
        for wheel in pin.wheels
        for tag in wheel.tags
        if tag.platform.endswith(arch)
    }
    assert {
        (version, str(dist))
        for version, dist in builds_here(REPO_ROOT / "patches", tags)
    } == {
        (version, str(wheel.dist))
        for version, pin in pins.items()
        for wheel in pin.wheels
        if wheel.tags & tags
    }


def test_pinned_releases_print_as_a_json_matrix(capsys):
    assert main(["releases"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == sorted(pinned_releases(REPO_ROOT / "patches"), key=Version)


def test_a_tag_publishes_only_a_tested_commit_through_a_checked_draft():
    assert gate_problems(load(WORKFLOW), load(CI_WORKFLOW)) == []


@pytest.mark.parametrize(
    ("old", "new", "caught"),
    [
        ("    needs: suite\n", "    needs: pins\n", "builds before the suite passed"),
        (
            "          python -m ci.workflow.release_assets",
            "          true",
            "does not publish through a draft it checked first",
        ),
        (" --draft --verify-tag", " --verify-tag", "does not publish through a draft"),
        (
            "    needs: [pins, publish]\n",
            "    needs: [pins, wheels]\n",
            "job images does not wait for the release to be public",
        ),
        (" --earlier earlier", "", "its index forgets the earlier releases"),
        (
            "git merge-base --is-ancestor",
            "git log -1",
            "does not check that the tag's commit is on main",
        ),
        ("      full: true\n", "", "does not run the full suite before publishing"),
    ],
)
def test_a_gate_left_out_is_caught(tmp_path, old, new, caught):
    text = WORKFLOW.read_text(encoding="utf-8")
    assert text.count(old) == 1
    workflow = tmp_path / "release.yml"
    workflow.write_text(text.replace(old, new))
    found = gate_problems(load(workflow), load(CI_WORKFLOW))
    assert found and all(caught in problem for problem in found), found


def test_the_gpu_job_runs_only_on_a_declared_runner_and_never_for_a_fork(tmp_path):
    assert gpu_problems(load(CI_WORKFLOW)) == []
    text = CI_WORKFLOW.read_text(encoding="utf-8")
    fork_guard = re.compile(r"\n\s*\|\| github\.event\.pull_request[^\n]*")
    unguarded = fork_guard.sub(")", text, count=1)
    assert unguarded != text
    workflow = tmp_path / "ci.yml"
    workflow.write_text(unguarded)
    assert gpu_problems(load(workflow)) == ["the GPU job runs a fork's pull request"]


def test_a_missing_platform_is_caught(tmp_path):
    text = WORKFLOW.read_text(encoding="utf-8")
    changed = text.replace(
        "runner: [ubuntu-24.04, ubuntu-24.04-arm]", "runner: [ubuntu-24.04]"
    )
    workflow = tmp_path / "release.yml"
    workflow.write_text(changed)
    assert problems(load(workflow)) == ["builds no aarch64 wheel"]
