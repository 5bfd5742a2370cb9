"""Running git, for any repository: the one place the tools start it.

Two kinds of repository meet here. The scratch repositories the tools build
(a series materialized as commits, a rebase's work tree) must give the same
bytes on every machine, so by default git reads neither the user's nor the
system's config. A maintainer's own checkout is the other kind: there their
identity and settings apply (`user_config=True`). Messages are always in
English, so that `git_cause` can find git's own statement of what failed.
"""

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from vllm_overlay.common.errors import OverlayError

# No config but the repository's own, and stable messages and dates.
ISOLATED_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
    "TZ": "UTC",
}
# The lines by which git states why it failed, as opposed to its hints.
_CAUSE_PREFIXES = ("error: ", "fatal: ")


def _environment(env: Mapping[str, str] | None, user_config: bool) -> dict[str, str]:
    isolation = {"LC_ALL": "C"} if user_config else ISOLATED_ENV
    return {**os.environ, **isolation, **(env or {})}


def git_run(
    repo: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    user_config: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run git in `repo`, for a caller that reads the exit status itself.

    Without the user's config by default: the scratch repositories must not
    depend on it. `user_config` is for the maintainer's own checkout, where
    their identity and settings apply."""
    return subprocess.run(
        ["git", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        env=_environment(env, user_config),
        check=False,
    )


def git_cause(proc: subprocess.CompletedProcess) -> str:
    """Why git failed, in its own words: its `error:` and `fatal:` lines.

    Not its last line: after a failed `am` or `cherry-pick` that is a hint
    on how to go on with an operation the tool has already undone, while
    the cause (`sha1 information is lacking ...`, `patch does not apply`)
    comes first."""
    output = [
        text.decode(errors="replace") if isinstance(text, bytes) else text or ""
        for text in (proc.stderr, proc.stdout)
    ]
    lines = [line.strip() for line in "\n".join(output).splitlines() if line.strip()]
    causes = [
        line.split(": ", 1)[1].rstrip(".")
        for line in lines
        if line.startswith(_CAUSE_PREFIXES)
    ]
    if not causes:
        causes = [line for line in lines if not line.startswith("hint:")][:1]
    return "; ".join(dict.fromkeys(causes)) or f"exit status {proc.returncode}"


def git(
    repo: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    user_config: bool = False,
) -> str:
    """Run git in `repo`, without the user's config unless `user_config`
    (`git_run`); a failure is an `OverlayError` with git's own cause
    (`git_cause`)."""
    proc = git_run(repo, *args, env=env, user_config=user_config)
    if proc.returncode != 0:
        raise OverlayError(f"git {args[0]} in {repo}: {git_cause(proc)}")
    return proc.stdout


def git_bytes(repo: Path, *args: str) -> bytes:
    """`git` for output that must stay bytes (a commit message is the
    author's, in whatever encoding they wrote it)."""
    proc = subprocess.run(
        ["git", *args],
        cwd=repo,
        capture_output=True,
        env=_environment(None, user_config=False),
        check=False,
    )
    if proc.returncode != 0:
        raise OverlayError(f"git {args[0]} in {repo}: {git_cause(proc)}")
    return proc.stdout
