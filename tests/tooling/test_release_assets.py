"""The draft check of the release workflow (`python -m
ci.workflow.release_assets`), run here on assets made as the workflow makes
them: the wheels, their SBOMs written by `ci/workflow/sbom.py`, and `vllm-overlay
index`'s SHA256SUMS and listing. The draft is stood in by a copy of what was
sent; each case changes what GitHub, or a broken step, could have changed."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from test_index import CPU_WHEEL, GPU_WHEEL, TOOL_WHEEL, make_wheel

from ci.workflow.release_assets import main
from ci.workflow.sbom import main as write_sboms
from vllm_overlay.wheel.index import write_index

BASE = "https://github.com/o/r/releases/download/v0.3.0"


@pytest.fixture
def sent(tmp_path: Path) -> list[Path]:
    dist = tmp_path / "release" / "dist"
    wheels = [
        make_wheel(dist, name, requires=("torch==2.9.0",))
        for name in (CPU_WHEEL, GPU_WHEEL)
    ]
    tool = make_wheel(tmp_path / "release" / "tool", TOOL_WHEEL, name="vllm-overlay")
    sboms = tmp_path / "release" / "sbom"
    assert write_sboms([str(dist), str(sboms)]) == 0
    site = tmp_path / "site"
    write_index(dist, site, BASE)
    boms = sorted(sboms.iterdir())
    return [*wheels, tool, *boms, site / "SHA256SUMS", site / "wheels.json"]


def draft_of(tmp_path: Path, sent: list[Path]) -> Path:
    draft = tmp_path / "draft"
    draft.mkdir()
    for path in sent:
        shutil.copyfile(path, draft / path.name)
    return draft


def check(capsys, draft: Path, sent: list[Path]) -> tuple[int, list[str]]:
    code = main([str(draft), *map(str, sent)])
    captured = capsys.readouterr()
    return code, captured.err.splitlines()


def test_a_draft_that_kept_everything_may_be_made_public(capsys, tmp_path, sent):
    assert check(capsys, draft_of(tmp_path, sent), sent) == (0, [])


def _rename_plus(draft: Path) -> None:
    (draft / CPU_WHEEL).rename(draft / CPU_WHEEL.replace("+", "."))


def _drop_sbom(draft: Path) -> None:
    (draft / f"{GPU_WHEEL}.cdx.json").unlink()


def _other_bytes(draft: Path) -> None:
    (draft / GPU_WHEEL).write_bytes(b"truncated")


CASES = {
    "a renamed asset": (
        _rename_plus,
        [
            f"::error::{CPU_WHEEL} was sent but the draft has no asset of that "
            "name (renamed?)",
            f"::error::the draft has {CPU_WHEEL.replace('+', '.')}, which was not sent",
        ],
    ),
    "an asset of other bytes": (
        _other_bytes,
        [f"::error::{GPU_WHEEL}: the draft's bytes differ from the file sent"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_what_github_changed_is_refused(capsys, tmp_path, sent, case):
    change, errors = CASES[case]
    draft = draft_of(tmp_path, sent)
    change(draft)
    assert check(capsys, draft, sent) == (1, errors)


def test_a_wheel_without_its_sbom_is_refused(capsys, tmp_path, sent):
    sent = [p for p in sent if p.name != f"{GPU_WHEEL}.cdx.json"]
    draft = draft_of(tmp_path, sent)
    assert check(capsys, draft, sent) == (
        1,
        [f"::error::{GPU_WHEEL} has no SBOM ({GPU_WHEEL}.cdx.json)"],
    )


def test_an_sbom_of_another_build_is_refused(capsys, tmp_path, sent):
    bom_path = next(p for p in sent if p.name == f"{GPU_WHEEL}.cdx.json")
    bom = json.loads(bom_path.read_text())
    bom["metadata"]["component"]["version"] = "0.32.0+hybridkv.2"
    bom_path.write_text(json.dumps(bom))
    draft = draft_of(tmp_path, sent)
    assert check(capsys, draft, sent) == (
        1,
        [f"::error::{GPU_WHEEL}.cdx.json is not the SBOM of vllm 0.32.0+hybridkv.3"],
    )


def test_sums_that_leave_out_a_wheel_are_refused(capsys, tmp_path, sent):
    sums = next(p for p in sent if p.name == "SHA256SUMS")
    lines = sums.read_text().splitlines()
    sums.write_text(lines[0] + "\n")
    draft = draft_of(tmp_path, sent)
    assert check(capsys, draft, sent) == (
        1,
        [
            "::error::SHA256SUMS does not list exactly the patched wheels with "
            f"their sha256: {GPU_WHEEL}"
        ],
    )


def test_a_missing_sent_file_is_one_line(capsys, tmp_path, sent):
    draft = draft_of(tmp_path, sent)
    code, errors = check(capsys, draft, [*sent, tmp_path / "nothing.whl"])
    assert (code, errors) == (
        1,
        [f"vllm-overlay: error: not a file sent: {tmp_path / 'nothing.whl'}"],
    )


def test_the_sbom_is_the_wheel_and_the_requirements_it_declares(tmp_path):
    requires = (
        "torch==2.9.0",
        "nixl>=1.5; platform_machine == 'x86_64'",
        "pytest; extra == 'test'",
    )
    wheel = make_wheel(tmp_path / "dist", GPU_WHEEL, requires=requires)
    assert write_sboms([str(tmp_path / "dist"), str(tmp_path / "sbom")]) == 0
    bom = json.loads((tmp_path / "sbom" / f"{GPU_WHEEL}.cdx.json").read_text())
    subject = bom["metadata"]["component"]
    assert (subject["name"], subject["version"], subject["purl"]) == (
        "vllm",
        "0.32.0+hybridkv.3",
        "pkg:pypi/vllm@0.32.0%2Bhybridkv.3",
    )
    assert subject["hashes"] == [
        {"alg": "SHA-256", "content": hashlib.sha256(wheel.read_bytes()).hexdigest()}
    ]
    assert [
        (c["purl"], [p["value"] for p in c["properties"]]) for c in bom["components"]
    ] == [
        ("pkg:pypi/nixl", ["nixl>=1.5; platform_machine == 'x86_64'"]),
        ("pkg:pypi/torch", ["torch==2.9.0"]),
    ]
    (graph,) = [d for d in bom["dependencies"] if d["ref"] == subject["bom-ref"]]
    assert graph["dependsOn"] == ["nixl", "torch"]


def test_an_sbom_without_dependencies_is_refused(capsys, tmp_path, sent):
    bom_path = next(p for p in sent if p.name == f"{CPU_WHEEL}.cdx.json")
    bom = json.loads(bom_path.read_text())
    bom["components"] = []
    bom_path.write_text(json.dumps(bom))
    draft = draft_of(tmp_path, sent)
    assert check(capsys, draft, sent) == (
        1,
        [
            f"::error::{CPU_WHEEL}.cdx.json lists no dependencies, or some without "
            "a purl: none listed"
        ],
    )
