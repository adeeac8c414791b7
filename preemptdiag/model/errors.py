"""The one error type. Anything the user can fix raises DiagError; the CLI's single
handler prints its message on one line and exits 2."""

from __future__ import annotations


class DiagError(Exception):
    """A usage or input problem, reported as one line with exit code 2."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
