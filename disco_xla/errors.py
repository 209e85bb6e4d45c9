"""The error types: `DiscoInputError` reaches users as a one-line message and
exit code 2; `RewriteError` says a rewritten module failed its own checks, and
its callers run the original program instead."""

from __future__ import annotations


class DiscoInputError(Exception):
    """Bad input: names the file (or other source) and the problem, in one line."""

    def __init__(self, source: str, problem: str):
        self.source = str(source)
        self.problem = " ".join(str(problem).split())  # keep it on one line
        super().__init__(f"{self.source}: {self.problem}")


class RewriteError(RuntimeError):
    """The rewritten module failed its own verification."""


def one_line(error: BaseException) -> str:
    """An exception as one line of at most 300 characters, with its type; one
    whose type says its message is for users whole (`shown_whole`, as
    `NoProfileError`'s says how to write a profile) as its message, whole."""
    if getattr(error, "shown_whole", False):
        return " ".join(str(error).split())
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]
