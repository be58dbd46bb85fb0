"""The exceptions the CLI turns into a one-line message and exit code 2 (and the server into a 4xx)."""


class LocalspecError(Exception):
    """A user-facing error: bad input, a bad model file, a failed install."""


class Unsupported(LocalspecError):
    """What this model cannot do for a request (no tool calls in its template, no FIM tokens): `param`
    names the request's field that asked for it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param
