"""The one exception type the CLI turns into a one-line message and exit code 2."""


class LocalspecError(Exception):
    """A user-facing error: bad input, a bad model file, a failed install."""
