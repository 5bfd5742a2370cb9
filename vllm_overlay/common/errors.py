"""The one error type the command line turns into a one-line message, and
the one place that prints it."""

import sys
from collections.abc import Callable


class OverlayError(Exception):
    """A user-facing failure: bad input, a failed download, a patch that does not
    apply. The message is a single line that says what is wrong and where; the
    CLI prints it and exits non-zero without a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def report_error(exc: OverlayError) -> None:
    """Print `exc` the one way every command does: `vllm-overlay: error: …`
    on stderr, one line."""
    print(f"vllm-overlay: error: {exc}", file=sys.stderr)


def exit_status(command: Callable[[], int]) -> int:
    """Run an entry point's `command`: its own exit status, or 1 with the
    error line (`report_error`) when it refuses with an `OverlayError`, or
    meets a file or folder it may not write (a cache or an output folder
    left by another user, a read-only mount): a permission is the user's to
    fix, not a bug to trace."""
    try:
        return command()
    except OverlayError as exc:
        report_error(exc)
        return 1
    except PermissionError as exc:
        report_error(
            OverlayError(
                f"permission denied: {exc.filename or exc} (a folder left by "
                "another user, e.g. a run with sudo?); make it writable by this "
                "user, or point the command elsewhere (VLLM_OVERLAY_CACHE, --out)"
            )
        )
        return 1
