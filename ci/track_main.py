"""The nightly check of the series against vLLM's main branch
(`.github/workflows/track-main.yml`): `vllm-overlay status --source` on a
clone at a ref, compared with the previous run's result.

The state directory (the workflow keeps it between runs) holds `last.json`,
the previous run's commit and verdicts, and `good.json`, the newest commit
at which no patch conflicted: the last good main commit, from which a
maintainer starts when a change breaks the series. Each run writes both
(`good.json` only when the commit is good), a Markdown summary (the job
summary: the commit, whether any verdict changed since the last run, the
last good commit, the per-patch table with the previous verdicts), and
exits 1 when a verdict changed, so that someone looks; the next run then
compares with this one. A first run (no state) changes nothing.

Usage: python -m ci.track_main CLONE [--ref REF] --state DIR [--summary FILE]
"""

import argparse
import json
import sys
from pathlib import Path

from vllm_overlay import atomic
from vllm_overlay.errors import OverlayError, report_error
from vllm_overlay.track.git_source import open_git_source
from vllm_overlay.track.status import PatchStatus, Verdict, status_at

LAST, GOOD = "last.json", "good.json"


def result(rows: list[PatchStatus]) -> dict[str, object]:
    """What a run keeps: the commit, its date and each patch's verdict."""
    first = rows[0]
    return {
        "commit": first.commit,
        "date": first.commit_date,
        "label": first.release,
        "series": first.series,
        "verdicts": {row.patch: row.verdict_text for row in rows},
    }


def read_state(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise OverlayError(f"{path}: not the JSON this script writes ({exc})") from None


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
    changed = changes(previous, current)
    if previous is None:
        headline = "First run: nothing to compare with."
    elif changed:
        headline = f"**Verdicts changed since the last run** (`{previous['commit']}`):"
    else:
        headline = f"No verdict changed since the last run (`{previous['commit']}`)."
    last_good = f"`{good['commit']}` ({good['date']})" if good else "none seen yet"
    before = previous["verdicts"] if previous else {}
    lines = [
        "# The series against vLLM main",
        "",
        f"Commit `{current['commit']}` ({current['date']}, {current['label']}), "
        f"checked against the {current['series']} series.",
        "",
        headline,
        *(f"- {line}" for line in changed),
        "",
        f"Last good commit (no patch conflicts): {last_good}",
        "",
        "| patch | verdict | last run |",
        "|---|---|---|",
        *(
            f"| `{patch}` | {verdict} | {before.get(patch, '-')} |"
            for patch, verdict in current["verdicts"].items()
        ),
    ]
    return "\n".join(lines) + "\n"


def track(clone: str, ref: str, state: Path, summary_file: Path | None) -> int:
    rows = status_at(open_git_source(f"{clone}@{ref}"))
    current = result(rows)
    previous = read_state(state / LAST)
    good = read_state(state / GOOD)
    if not any(row.verdict is Verdict.CONFLICT for row in rows):
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
    return 1 if changes(previous, current) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("clone", help="a git clone of vLLM")
    parser.add_argument("--ref", default="HEAD", help="the commit to check")
    parser.add_argument("--state", type=Path, required=True, help="kept between runs")
    parser.add_argument("--summary", type=Path, help="append the Markdown summary")
    args = parser.parse_args(argv)
    try:
        return track(args.clone, args.ref, args.state, args.summary)
    except OverlayError as exc:
        report_error(exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
