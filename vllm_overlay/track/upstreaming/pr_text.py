"""The pull request text of `vllm-overlay extract`: title and description.

`extract.py` makes the commits (the stack, the branch, the mbox); this
module only writes about them, in the sections of the release's own pull
request template (`.github/PULL_REQUEST_TEMPLATE.md` of its sdist), so that
a change of vLLM's template or of what reviewers ask for touches the text
alone. What it says comes from the commits as sent: the patch's message
(why, then what), the stack it depends on, the PRs and issues the message
names, the new tests and how each fared on vLLM as released.
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay.series.model import TESTS_DIR, Patch, Series
from vllm_overlay.track.status.probing import FAILED
from vllm_overlay.track.upstreaming.probe_conversion import ConvertedTests

TEMPLATE = Path(".github") / "PULL_REQUEST_TEMPLATE.md"
# The sections of a template that has none this module knows how to fill.
DEFAULT_SECTIONS = ("Purpose", "Test Plan", "Test Result")
# `#123`, `vllm#123`, `LMCache #123`, `owner/name#123`, and full links.
_REFERENCE = re.compile(
    r"(?:\b(?P<repo>[\w.-]+/[\w.-]+)|\b(?P<project>vllm|lmcache)\s?)?"
    r"#(?P<number>\d{3,6})\b|https://github\.com/\S+/(?:pull|issues)/\d+",
    re.IGNORECASE,
)
_PROJECTS = {"vllm": "vllm-project/vllm", "lmcache": "LMCache/LMCache"}
_LINE_REFERENCE = re.compile(r"([\w./-]+\.py):\d+")
_GITHUB = "https://github.com"


@dataclass(frozen=True)
class Commit:
    """One commit of the contribution: the patch, its tests and its message
    as sent (without our trailers, signed off)."""

    patch: Patch
    tests: ConvertedTests
    message: str


def pr_description(
    commits: Sequence[Commit],
    series: Series,
    sdist: Path,
    outcomes: dict[str, str],
) -> str:
    """The PR title and description in markdown, in the sections of the
    release's pull request template (`.github/PULL_REQUEST_TEMPLATE.md` of
    its sdist): Purpose, Test Plan and Test Result, or Overview, Claims,
    Validation and Details. Our messages open with why the change is
    needed, then say what it does; the sign-off closes them."""
    template = sdist / TEMPLATE
    text = template.read_text(encoding="utf-8") if template.is_file() else ""
    headings = re.findall(r"^## (.+?)\s*$", text, re.MULTILINE)
    sections = _sections(commits, series, sdist, outcomes)
    if not headings or not set(headings) & set(sections):
        headings, text = list(DEFAULT_SECTIONS), ""
    parts = [f"# {commits[-1].patch.subject}\n"]
    for heading in headings:
        parts += [f"## {heading}\n", sections.get(heading, "")]
    checklist = text.split("\n---\n", 1)
    if len(checklist) == 2:
        parts.append("---\n" + checklist[1].rstrip("\n") + "\n")
    return "\n".join(part for part in parts if part)


def _sections(
    commits: Sequence[Commit],
    series: Series,
    sdist: Path,
    outcomes: dict[str, str],
) -> dict[str, str]:
    """Every section either template asks for, by heading."""
    last = commits[-1]
    paragraphs = [p for p in last.message.strip().split("\n\n") if p.strip()]
    why, *what = paragraphs[1:-1]  # after the subject, before the sign-off
    summary = _summary(last)
    depends = _dependency(commits[:-1])
    related = _related(last)
    lines = _line_note(last.message, sdist, series.release.version)
    details = "\n".join(p + "\n" for p in [why, *what, lines] if p)
    plan = _test_plan(commits, series.release.version)
    result = _test_result(commits, series.release.version, outcomes)
    overview = "\n".join(p for p in [summary, depends, related] if p)
    claims = f"- {_sentence(last.patch.subject)}\n" + "".join(
        f"- New test `{test}`\n" for test in last.tests.test_ids
    )
    return {
        "Purpose": "\n".join(p for p in [summary, depends, details, related] if p),
        "Test Plan": plan,
        "Test Result": result,
        "Overview": overview,
        "Claims": claims,
        "Validation": plan + "\n" + result,
        "Details": details,
    }


def _sentence(subject: str) -> str:
    return f"{subject[0].upper()}{subject[1:]}."


def _summary(commit: Commit) -> str:
    changed = [f for f in commit.patch.files if not f.startswith(TESTS_DIR)]
    updated = [f for f in commit.patch.files if f.startswith(TESTS_DIR)]
    return (
        _sentence(commit.patch.subject)
        + " Changes "
        + ", ".join(f"`{f}`" for f in changed)
        + (f"; updates {', '.join(f'`{f}`' for f in updated)}" if updated else "")
        + f"; adds the tests in `{commit.tests.package}/`.\n"
    )


def _dependency(prerequisites: Sequence[Commit]) -> str:
    """The stack, said plainly: which earlier commits this PR needs."""
    if not prerequisites:
        return ""
    count = len(prerequisites)
    lines = [
        f"**Depends on {'an earlier change' if count == 1 else 'earlier changes'}**"
        f", included as the first {'commit' if count == 1 else f'{count} commits'} "
        "of this branch (each with its own tests); only the last commit is this "
        "change. Please review or merge "
        f"{'it' if count == 1 else 'them'} first:\n"
    ]
    for commit in prerequisites:
        pr = commit.patch.upstream_pr
        lines.append(
            f"- {commit.patch.subject}"
            + (f" (proposed in {pr})" if pr != "none" else "")
            + "\n"
        )
    return "".join(lines)


def _related(commit: Commit) -> str:
    links = _references(commit.patch, commit.message)
    return ("Related:\n" + "".join(f"- {link}\n" for link in links)) if links else ""


def _test_plan(commits: Sequence[Commit], version: str) -> str:
    updated = [f for c in commits for f in c.patch.files if f.startswith(TESTS_DIR)]
    commands = [f"pytest {c.tests.package} -v" for c in commits]
    commands += [f"pytest {f} -v" for f in dict.fromkeys(updated)]
    return (
        f"On this branch, based on vLLM v{version}:\n\n"
        "```bash\n" + "\n".join(commands) + "\n```\n"
    )


def _test_result(
    commits: Sequence[Commit], version: str, outcomes: dict[str, str]
) -> str:
    """What was measured: each new test on vLLM as released. The run with
    the change is the submitter's to paste."""
    lines = [f"Without this change, on vLLM v{version} as released:\n"]
    for commit in commits:
        for probe, test in zip(commit.patch.probes, commit.tests.test_ids, strict=True):
            lines.append(f"- `{test}`: {outcomes.get(probe, FAILED)}\n")
    lines.append("\nWith this change:\n\n<!-- the output of the commands above -->\n")
    return "".join(lines)


def _line_note(message: str, sdist: Path, version: str) -> str:
    """Which release the message's `file.py:LINE` references to vLLM files
    belong to; references to other projects' files are left alone."""
    ours = [
        m.group(0)
        for m in _LINE_REFERENCE.finditer(message)
        if _is_vllm_file(m.group(1), sdist)
    ]
    if not ours:
        return ""
    examples = ", ".join(f"`{r}`" for r in list(dict.fromkeys(ours))[:3])
    return (
        f"Line numbers in references to vLLM files ({examples}) are those of "
        f"vLLM v{version}, the release this branch is based on."
    )


def _is_vllm_file(path: str, sdist: Path) -> bool:
    """Whether vLLM's sources hold a file whose path ends with `path`."""
    top = path.split("/", 1)[0]
    if top in ("vllm", "tests"):
        return (sdist / path).is_file()
    return any((sdist / "vllm").rglob(path)) or any((sdist / "tests").rglob(path))


def _references(patch: Patch, message: str) -> list[str]:
    """The Upstream-PR link and every PR or issue the message names, once,
    each linked to its own project: a bare `#N` or `vllm#N` is vLLM's,
    `LMCache #N` LMCache's, `owner/name#N` that repository's."""
    found = [] if patch.upstream_pr == "none" else [patch.upstream_pr]
    for match in _REFERENCE.finditer(message):
        number = match.group("number")
        if number is None:
            found.append(match.group(0))
            continue
        project = (match.group("project") or "vllm").lower()
        repository = match.group("repo") or _PROJECTS[project]
        found.append(f"{_GITHUB}/{repository}/pull/{number}")
    return list(dict.fromkeys(link.rstrip(".,);") for link in found))
