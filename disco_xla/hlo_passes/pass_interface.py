"""What a rewrite pass is, and how a pipeline of them runs (XLA's HloPassInterface
and HloPassPipeline, in small).

A pass has a `name` and a `run(module) -> bool` that rewrites the module in
place and says whether it changed it. It is configured in its constructor with
plain data (instruction names, indices, counts), never with a plan or another
pass's state, so that the passes sit below the plan in the layers and can be
composed in any pipeline. A pass that changed the module leaves its graph view
rebuilt (`HloModule.rebuild`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from disco_xla.hlo.graph import HloModule

# Checks a module after a pass changed it; raises if the module is not sound.
# Called with the module and the pass's name.
VerifierFn = Callable[[HloModule, str], None]


@runtime_checkable
class HloPass(Protocol):
    """One rewrite: `name` identifies it (as XLA's `name()`), `run` applies it
    and returns whether the module changed."""

    name: str

    def run(self, module: HloModule) -> bool: ...


def run_pipeline(
    module: HloModule, passes: Sequence[HloPass], verifier: VerifierFn | None = None
) -> bool:
    """Run `passes` in order on `module`; `verifier` runs after each pass that
    changed it. Returns whether any pass changed the module."""
    changed = False
    for hlo_pass in passes:
        if hlo_pass.run(module):
            changed = True
            if verifier is not None:
                verifier(module, hlo_pass.name)
    return changed
