"""Errors shared by every layer: the two the project raises on bad input."""


class UserError(ValueError):
    """Bad input from a user or a file: the CLI prints its message as one line and exits 2."""


class WireError(UserError):
    """Bytes or a value from outside (the network, the worker socket, a file) that do not make a
    valid record: the one error every decoder raises (p2ptrain/records/).

    The message starts with its category (malformed, oversized, unsigned, forged, replayed, or
    stale: an honest message delivered too late, which is dropped without blame). Being a
    UserError, a bad file read by a command ends as one error line and exit code 2.
    """

    @property
    def category(self) -> str:
        return str(self).split(":", 1)[0].split(" ", 1)[0]


def first_leaf(error: BaseException) -> BaseException:
    """The first plain exception inside (possibly nested) exception groups: what trio raises
    out of a nursery, reduced to the one error a user should read."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
