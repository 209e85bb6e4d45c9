"""What has been worked out about one module, kept beside it
(`HloModule.analyses`) and dropped when a pass changes the module
(`HloModule.rebuild`), as XLA keeps analyses beside an HloModule and LLVM's
analysis manager invalidates them after a pass. The simulator's index of the
module, its collectives, its kernels' parts and the gradients' dependencies
and kinds are kept here, each under a key of its own."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any


class AnalysisCache:
    """Results by key, each computed once until `clear`."""

    def __init__(self) -> None:
        self._found: dict[Hashable, Any] = {}

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The result under `key`, from `compute()` the first time."""
        try:
            return self._found[key]
        except KeyError:
            value = self._found[key] = compute()
            return value

    def clear(self) -> None:
        self._found.clear()

    def __len__(self) -> int:
        return len(self._found)
