"""The one exception for expected failures: the CLI prints its message and exits 2."""


class HarnessError(Exception):
    """A failure the user can fix (bad checkpoint, mismatch, unreachable server...).

    The message is a self-contained paragraph: which path, what was expected, what was
    found, and what to do next. The CLI shows it without a traceback.
    """
