"""The nightly check of the series against vLLM's main branch
(`.github/workflows/track-main.yml`): `vllm-overlay status --source` on a
clone at a commit, upstream's test hunks included.

The job is red (exit 1) on every run at which any patch conflicts, merges
only 3-way (`merges (3-way)`: `rebase` takes it, but the patch as committed
does not apply) or applies only with offset (or fuzz): the build and the
harness refuse all three, so the series as committed would not build on that
commit. It stays red for as
long as that lasts, a first run included, not only on the night a verdict
changes. It is green when every patch applies exactly; a patch upstream
already has (`already present`) or that a rebase drops (`dropped by
rebase`) is green too, since the next rebase drops it without a hand edit.

The state directory (the workflow keeps it between runs and uploads it as
the artifact) holds `last.json`, this run's commit, verdicts and failing
patches (each with its detail and its hunks: file, hunk number, line,
kind), and `good.json`, the newest commit at which the run was green: the
last good main commit, from which a maintainer bisects when a change breaks
the series. A `good.json` kept from before this rule (when an offset still
counted as good) is not shown as good. Each run writes `last.json` (and
`good.json` when green) and a Markdown summary (the job summary): red or
green, each failing patch with the file and hunk that failed, the last good
commit with the `git log` of the failing files since then, the verdicts that
changed since the last run, and the per-patch table.

A commit is named as `vllm-overlay status --source` names it: `CLONE@REF`
(or `CLONE` for its HEAD).

Usage: python -m ci.track_main CLONE[@REF] --state DIR [--summary FILE]
"""

import json
import sys
from pathlib import Path

from vllm_overlay.argparsing import Parser
from vllm_overlay.common import atomic
from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.track.status.judging import PatchStatus, Verdict
from vllm_overlay.track.status.status import status_at
from vllm_overlay.track.workspace.git_source import open_git_source

LAST, GOOD = "last.json", "good.json"
PROG = "python -m ci.track_main"
# The verdicts of a green run: the series builds as it is, or the next
# rebase drops the patch unasked. Not `Verdict.MERGES`: the next rebase
# keeps that patch, but only refreshed, so the committed one does not build.
GREEN = (Verdict.EXACT, Verdict.PRESENT, Verdict.DROPPED)
REF_HINT = (
    "name the commit with the clone, CLONE@REF, as `vllm-overlay status "
    "--source PATH@REF` does"
)


def result(rows: list[PatchStatus]) -> dict[str, object]:
    """What a run keeps: the commit, its date, each patch's verdict, and
    what failed of each patch that keeps the run from being green."""
    first = rows[0]
    return {
        "commit": first.commit,
        "date": first.commit_date,
        "label": first.release,
        "series": first.series,
        "verdicts": {row.patch: row.verdict_text for row in rows},
        "failing": {
            row.patch: {
                "verdict": row.verdict_text,
                "detail": row.detail,
                "hunks": [
                    {"file": h.file, "hunk": h.hunk, "line": h.line, "kind": h.kind}
                    for h in row.hunks
                ],
            }
            for row in rows
            if row.verdict not in GREEN
        },
    }


def is_green(kept: dict) -> bool:
    """Whether a kept run had every patch green (also for a `good.json`
    written before the offset counted as a failure)."""
    green = {str(verdict) for verdict in GREEN}
    return all(verdict in green for verdict in kept["verdicts"].values())


def read_state(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise OverlayError(f"{path}: not the JSON this script writes ({exc})") from None
    if not isinstance(kept, dict) or not isinstance(kept.get("verdicts"), dict):
        raise OverlayError(f"{path}: not the JSON this script writes (no verdicts)")
    return kept


def changes(previous: dict | None, current: dict) -> list[str]:
    """Each patch whose verdict differs from the previous run's, as a line."""
    if previous is None:
        return []
    before, now = previous["verdicts"], current["verdicts"]
    return [
        f"{patch}: {before.get(patch, 'not in the series')} -> "
        f"{now.get(patch, 'not in the series')}"
        for patch in sorted(set(before) | set(now))
        if before.get(patch) != now.get(patch)
    ]


def summary(current: dict, previous: dict | None, good: dict | None) -> str:
    failing = current["failing"]
    headline = ["Green: every patch applies exactly."]
    if failing:
        headline = [
            f"**Red: {len(failing)} patch(es) do not apply exactly** (the build "
            "refuses a conflict and an offset alike):",
            *(
                f"- `{patch}` {failure['verdict']}: {failure['detail']}"
                for patch, failure in failing.items()
            ),
        ]
    before = previous["verdicts"] if previous else {}
    lines = [
        "# The series against vLLM main",
        "",
        f"Commit `{current['commit']}` ({current['date']}, "
        f"{current['label']}), checked against the {current['series']} series.",
        "",
        *headline,
        "",
        *_last_good(current, good),
        "",
        *_since(current, previous),
        "",
        "| patch | verdict | detail | last run |",
        "|---|---|---|---|",
        *(
            f"| `{patch}` | {verdict} | "
            f"{_cell(failing.get(patch, {}).get('detail', ''))} | "
            f"{before.get(patch, '-')} |"
            for patch, verdict in current["verdicts"].items()
        ),
    ]
    return "\n".join(lines) + "\n"


def _last_good(current: dict, good: dict | None) -> list[str]:
    """The last good commit, and while red, where to look for the change
    that broke the series: the commits since then that touch a failing file."""
    if good is None:
        return ["Last good commit (every patch applies exactly): none seen yet"]
    lines = [
        f"Last good commit (every patch applies exactly): `{good['commit']}` "
        f"({good['date']})"
    ]
    files = sorted({h["file"] for f in current["failing"].values() for h in f["hunks"]})
    if files and good["commit"] != current["commit"]:
        lines += [
            "",
            "The commits since then that touch the failing files: "
            f"`git log --oneline {good['commit'][:12]}..{current['commit'][:12]} "
            f"-- {' '.join(files)}`",
        ]
    return lines


def _since(current: dict, previous: dict | None) -> list[str]:
    if previous is None:
        return ["First run: no earlier verdicts to compare with."]
    changed = changes(previous, current)
    if not changed:
        return [f"No verdict changed since the last run (`{previous['commit']}`)."]
    return [
        f"Verdicts changed since the last run (`{previous['commit']}`):",
        *(f"- {line}" for line in changed),
    ]


def _cell(text: str) -> str:
    """`text` as one Markdown table cell."""
    return text.replace("|", "\\|") or "-"


def track(source: str, state: Path, summary_file: Path | None) -> int:
    rows = status_at(open_git_source(source, "CLONE"))
    if not rows:
        # Every patch merged upstream: no verdict to keep, and none to show.
        raise OverlayError(
            f"the series checked against {source} has no patches: nothing to "
            "track against vLLM main"
        )
    current = result(rows)
    previous = read_state(state / LAST)
    good = read_state(state / GOOD)
    if good is not None and not is_green(good):
        good = None
    if not current["failing"]:
        good = current
    text = summary(current, previous, good)
    state.mkdir(parents=True, exist_ok=True)
    atomic.write_text(state / LAST, json.dumps(current, indent=2) + "\n")
    if good is current:
        atomic.write_text(state / GOOD, json.dumps(current, indent=2) + "\n")
    if summary_file is not None:
        with open(summary_file, "a", encoding="utf-8") as handle:
            handle.write(text)
    print(text, end="")
    return 1 if current["failing"] else 0


def parse(argv: list[str] | None) -> tuple[str, Path, Path | None]:
    """The clone and commit, the state directory and the summary file; a
    `--ref` (this script's old spelling) is refused naming the one to use."""
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "source", metavar="CLONE[@REF]", help="a git clone of vLLM at REF (HEAD)"
    )
    parser.add_argument("--state", type=Path, required=True, help="kept between runs")
    parser.add_argument("--summary", type=Path, help="append the Markdown summary")
    args, leftovers = parser.parse_known_args(argv)
    if leftovers and leftovers[0].split("=", 1)[0] == "--ref":
        raise OverlayError(f"{PROG} takes no --ref: {REF_HINT}")
    if leftovers:
        parser.error(f"unrecognized arguments: {' '.join(leftovers)}")
    return args.source, args.state, args.summary


def main(argv: list[str] | None = None) -> int:
    try:
        return track(*parse(argv))
    except OverlayError as exc:
        report_error(exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
