"""The one error type the command line turns into a one-line message."""


class OverlayError(Exception):
    """A user-facing failure: bad input, a failed download, a patch that does not
    apply. The message is a single line that says what is wrong and where; the
    CLI prints it and exits non-zero without a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
