"""One error family. User errors (bad spec, bad command line) exit 2; failed checks exit 1."""

from __future__ import annotations


class OpgenError(Exception):
    """An error the user can fix; the CLI prints it without a traceback."""

    exit_code = 2


class SpecError(OpgenError):
    """Every problem found in one spec file, as `path: field: message` lines."""

    def __init__(self, path: str, problems: list[tuple[str, str]]):
        self.path = path
        self.problems = problems
        super().__init__("\n".join(f"{path}: {field}: {msg}" if field else f"{path}: {msg}"
                                   for field, msg in problems))


class CheckFailed(OpgenError):
    """A check (generated/ out of step, compile failure) did not pass."""

    exit_code = 1


class Interrupted(OpgenError):
    """Ctrl-C or SIGTERM: the shell's exit status for SIGINT."""

    exit_code = 130
