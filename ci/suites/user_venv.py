"""Commands run in the new virtualenv of the install checks
(`index_install.py`, then `user_install.py`) as a user runs them: outside
the checkout, without the suite's variables (the installed vllm-overlay and
its packaged series run, not this checkout's), each step timed under the
suite step's name."""

import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ci.suites.servers import server_environment
from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError

T = TypeVar("T")
# The suite step's name, in the suite's summary and in each line it prints.
STEP = "install from the index"
# What the new environment must not inherit from the suite.
DROPPED = ("PYTHONPATH", "VLLM_OVERLAY_PATCHES", "VLLM_TARGET_DEVICE")


def step(name: str, action: Callable[..., T], *args: object, **kwargs: object) -> T:
    """`action(*args, **kwargs)`, its seconds printed under `name`."""
    started = time.monotonic()
    result = action(*args, **kwargs)
    print(f"{STEP}: {name} ({time.monotonic() - started:.1f} s)", flush=True)
    return result


def pip(venv: Path, *args: str) -> str:
    """pip with the virtualenv's Python (the dependency layer's pip, which
    installs into the environment that runs it)."""
    return run(
        str(venv / "bin" / "python"),
        *("-m", "pip", "--disable-pip-version-check", "--no-input"),
        *args,
    )


def environment(cache: Path) -> dict[str, str]:
    """A server's environment (`servers.server_environment`), less what the
    new environment must not inherit."""
    env = server_environment(cache_layout.serve_e2e(cache).vllm_cache)
    return {k: v for k, v in env.items() if k not in DROPPED}


def run(*command: str | Path, env: dict[str, str] | None = None) -> str:
    """Run `command` outside the checkout; its stdout, or an `OverlayError`
    with the last lines of its output."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    proc = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        check=False,
    )
    if proc.returncode:
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise OverlayError(f"{Path(str(command[0])).name} failed: {tail}")
    return proc.stdout
