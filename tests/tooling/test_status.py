"""`vllm-overlay status`: each patch's verdict against pinned and unpinned
releases, from synthetic wheels; the download of an unpinned release is faked."""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import (
    SCHEDULER,
    SCHEDULER_SOURCE,
    format_patch,
    make_wheel,
    scheduler_edit,
)

from vllm_overlay import status as status_module
from vllm_overlay.cli import main
from vllm_overlay.pins import Artifact, ReleasePin

PATCHED = scheduler_edit(20, "line twenty, patched")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@dataclass
class FakeIndex:
    """Unpinned releases a faked download serves: version -> scheduler text."""

    releases: dict[str, str] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def download(self, version: str, directory: Path) -> Path:
        self.calls.append(version)
        name = f"vllm-{version}-cp38-abi3-linux_x86_64.whl"
        scheduler = self.releases[version].encode()
        return make_wheel(directory / name, members={SCHEDULER: scheduler})


@pytest.fixture
def upstream(monkeypatch, project) -> FakeIndex:
    index = FakeIndex()
    monkeypatch.setattr(status_module, "_pip_download_wheel", index.download)
    return index


def verdicts(capsys, *releases: str) -> list[dict]:
    code, out, err = run(capsys, "status", "--json", *releases)
    assert code == 0, err
    return json.loads(out)


def test_pinned_release_applies_exactly(project, capsys):
    code, out, err = run(capsys, "status")
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["release", "series", "patch", "verdict", "detail"]
    assert row.startswith("9.9.0    9.9.0   scheduler-demo.patch  applies exactly")
    assert "checking vLLM 9.9.0 against the 9.9.0 series" in err


def test_json_shape(project, capsys):
    assert verdicts(capsys, "v9.9") == [
        {
            "release": "9.9.0",
            "pinned": True,
            "series": "9.9.0",
            "patch": "scheduler-demo.patch",
            "verdict": "applies exactly",
            "detail": "",
        }
    ]


def test_drift_by_one_line_is_not_exact(project, upstream, capsys):
    upstream.releases["9.9.1"] = "new first line\n" + SCHEDULER_SOURCE
    (row,) = verdicts(capsys, "9.9.1")
    assert row["pinned"] is False
    assert row["series"] == "9.9.0"
    assert row["verdict"] == "applies only with offset"
    assert row["detail"] == f"{SCHEDULER} hunk #1 at line 18 (offset)"


def test_changed_context_conflicts_naming_file_and_hunk(project, upstream, capsys):
    upstream.releases["9.9.2"] = scheduler_edit(18, "line eighteen, rewritten upstream")
    (row,) = verdicts(capsys, "9.9.2")
    assert row["verdict"] == "conflicts"
    assert row["detail"] == f"{SCHEDULER} hunk #1 (at line 17) does not match"


def test_change_already_upstream(project, upstream, capsys):
    upstream.releases["9.9.3"] = PATCHED
    (row,) = verdicts(capsys, "9.9.3")
    assert row["verdict"] == "already present"


def test_later_patches_see_earlier_ones(project, upstream, capsys):
    project.add_patch(
        "scheduler-follow-up.patch",
        format_patch(
            project.workdir,
            {SCHEDULER: PATCHED},
            {SCHEDULER: PATCHED.replace("line 21\n", "line 21, follow-up\n")},
            subject="scheduler: follow-up",
        ),
    )
    upstream.releases["9.9.1"] = "new first line\n" + SCHEDULER_SOURCE
    rows = verdicts(capsys, "9.9.1")
    assert [r["verdict"] for r in rows] == ["applies only with offset"] * 2


def test_unpinned_release_is_labelled_and_cached(project, upstream, capsys):
    upstream.releases["9.9.3"] = PATCHED
    code, out, err = run(capsys, "status", "9.9.3")
    assert code == 0, err
    assert out.splitlines()[1].startswith("9.9.3 (unpinned)  9.9.0 ")
    assert "downloading vllm==9.9.3 (unpinned" in err
    run(capsys, "status", "9.9.3")
    assert upstream.calls == ["9.9.3"]


def test_unknown_release_is_a_one_line_error(project, monkeypatch, capsys):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    code, out, err = run(capsys, "status", "0.0.1")
    assert code == 1
    assert out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith("vllm-overlay: error: cannot download vllm==0.0.1")


def test_not_a_version_is_refused_before_any_download(project, capsys):
    code, _, err = run(capsys, "status", "latest")
    assert code == 1
    assert err == "vllm-overlay: error: 'latest' is not a version number\n"


def test_nearest_series_is_the_greatest_pinned_release_not_after():
    pins = {
        v: ReleasePin(v, 1, Artifact(f"vllm-{v}.tar.gz", "0" * 64), ())
        for v in ("0.31.0", "0.32.0", "0.33.0")
    }
    nearest = status_module.nearest_release
    assert nearest(pins, "0.32.0").version == "0.32.0"
    assert nearest(pins, "0.32.5").version == "0.32.0"
    assert nearest(pins, "0.40.0").version == "0.33.0"
    assert nearest(pins, "0.33.0rc1").version == "0.32.0"
    assert nearest(pins, "0.10.0").version == "0.31.0"
