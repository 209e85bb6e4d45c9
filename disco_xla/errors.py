"""The one error type that reaches users as a one-line message and exit code 2."""

from __future__ import annotations


class DiscoInputError(Exception):
    """Bad input: names the file (or other source) and the problem, in one line."""

    def __init__(self, source: str, problem: str):
        self.source = str(source)
        self.problem = " ".join(str(problem).split())  # keep it on one line
        super().__init__(f"{self.source}: {self.problem}")
