"""Errors shared by every layer."""


class UserError(ValueError):
    """Bad input from a user or a file: the CLI prints its message as one line and exits 2."""
