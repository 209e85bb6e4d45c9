"""What a plan dimension declares (`Dimension`), and what its check reads
(`Verification`). Each dimension is one module of this package; `plan.core`
lists them, once, in the order the rewrite applies them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule, Instruction

if TYPE_CHECKING:
    from disco_xla.plan.core import Plan


@dataclass
class Verification:
    """What every dimension's check reads: the module, its instructions by
    name, the source named in errors, and what the checks before it found
    (the fusion check leaves each compute instruction's group in `group_of`)."""

    module: HloModule
    source: str
    by_name: dict[str, Instruction]
    max_expensive_ops_per_kernel: int = 1
    group_of: dict[int, int] = field(default_factory=dict)

    def fail(self, problem: str) -> DiscoInputError:
        """The error a check raises: one line naming the plan's source."""
        return DiscoInputError(self.source, problem)


@dataclass(frozen=True)
class Dimension:
    """One dimension of a plan: the `Plan` field that holds it, how its JSON
    reads and writes, its legality check, and how a report describes it.

    - `name`: how reports and the ablation name it ('chunks').
    - `field`: the `Plan` field ('chunked_collectives'); empty: the module as
      it is in this dimension.
    - `read(data)`: the field's value from a plan's JSON object (absent: empty).
    - `write(value)`: the JSON value; an empty value is left out of the JSON
      unless `always_written` (a plan without a newer dimension reads as before).
    - `check(plan, verification)`: raise `verification.fail(...)` unless the
      plan is legal in this dimension; checks run in `DIMENSIONS` order.
    - `describe(plan)`: one line for the report's table, or None.
    - `after`: the dimensions whose rewrite runs before this one's.
    """

    name: str
    field: str
    meaning: str
    read: Callable[[dict], Any]
    write: Callable[[Any], Any]
    check: Callable[[Plan, Verification], None]
    describe: Callable[[Plan], str | None]
    after: tuple[str, ...] = ()
    always_written: bool = False


def names_in_groups(data: dict, key: str, required: bool = False) -> tuple[tuple[str, ...], ...]:
    """A list of lists of names in a plan's JSON ((): absent, where not `required`)."""
    groups = data[key] if required else data.get(key, ())
    return tuple(tuple(map(str, group)) for group in groups)


def as_lists(groups: tuple[tuple[str, ...], ...]) -> list[list[str]]:
    return [list(group) for group in groups]
