"""`Plan`, its JSON, and `verify_plan`, each a loop over the dimensions
(`DIMENSIONS`), declared here once in the order the rewrite applies them."""

from __future__ import annotations

import json
from dataclasses import dataclass

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule, Instruction
from disco_xla.plan.all_gather_buckets import ALL_GATHER_BUCKETS
from disco_xla.plan.all_reduce_buckets import ALL_REDUCE_BUCKETS, gradient_all_reduces_in_order
from disco_xla.plan.chunks import CHUNKS
from disco_xla.plan.dimension import Dimension, Verification
from disco_xla.plan.fusion import FUSION, compute_instructions
from disco_xla.plan.prefetch import PREFETCH

PLAN_FORMAT = "disco-xla-plan/1"

# The plan's dimensions, in the order the rewrite applies them (each after the
# ones its `after` names) and its checks run. A new dimension is a module of
# this package, a field of `Plan`, and a row here and in each layer's table
# (`docs/development.md`, "Adding a plan dimension").
DIMENSIONS: tuple[Dimension, ...] = (
    FUSION,
    ALL_REDUCE_BUCKETS,
    ALL_GATHER_BUCKETS,
    CHUNKS,
    PREFETCH,
)
IDENTITY_FIELDS = ("module_name", "fingerprint")


@dataclass(frozen=True)
class Plan:
    """A strategy for one module, by instruction name: one field a dimension
    (`DIMENSIONS`; each module of this package says what its field holds),
    beside the module's name and fingerprint."""

    module_name: str
    fingerprint: str
    fusion_groups: tuple[tuple[str, ...], ...]
    all_reduce_buckets: tuple[tuple[str, ...], ...]
    all_gather_buckets: tuple[tuple[str, ...], ...] = ()
    prefetched_all_gathers: tuple[str, ...] = ()
    chunked_collectives: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> str:
        data = {"format": PLAN_FORMAT, "module": self.module_name, "fingerprint": self.fingerprint}
        for dimension in DIMENSIONS:
            value = getattr(self, dimension.field)
            if value or dimension.always_written:  # a plan without it reads as before
                data[dimension.field] = dimension.write(value)
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "<plan>") -> Plan:
        try:
            data = json.loads(text)
            if data.get("format") != PLAN_FORMAT:
                raise ValueError(f"not a {PLAN_FORMAT} plan")
            return cls(
                module_name=str(data["module"]),
                fingerprint=str(data["fingerprint"]),
                **{dimension.field: dimension.read(data) for dimension in DIMENSIONS},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise DiscoInputError(source, f"not a disco-xla plan ({error})") from None

    @classmethod
    def unfused(cls, module: HloModule) -> Plan:
        """No op fusion, one all-reduce per gradient: the `none` baseline."""
        return cls(
            module_name=module.name,
            fingerprint=module.fingerprint,
            fusion_groups=tuple((i.name,) for i in compute_instructions(module)),
            all_reduce_buckets=tuple((a.name,) for a in gradient_all_reduces_in_order(module)),
        )


def verify_plan(
    plan: Plan, module: HloModule, max_expensive_ops_per_kernel: int = 1, source: str = "<plan>"
) -> None:
    """Raise DiscoInputError with the reason if `plan` is not legal for
    `module`: the fingerprint first, then each dimension's check in
    `DIMENSIONS` order (each module of this package says what it checks)."""
    if plan.fingerprint != module.fingerprint:
        raise DiscoInputError(
            source,
            f"the plan is for another module ({plan.module_name}, fingerprint "
            f"{plan.fingerprint[:12]}), not {module.name} ({module.fingerprint[:12]})",
        )
    verification = Verification(
        module, source, _instructions_by_name(module, source), max_expensive_ops_per_kernel
    )
    for dimension in DIMENSIONS:
        dimension.check(plan, verification)


def _instructions_by_name(module: HloModule, source: str) -> dict[str, Instruction]:
    by_name: dict[str, Instruction] = {}
    for instr in module.instructions():
        if instr.name in by_name:
            raise DiscoInputError(source, f"the module has two instructions named {instr.name!r}")
        by_name[instr.name] = instr
    return by_name


def dimension_named(name: str) -> Dimension:
    """The dimension reports call `name` ('chunks'); KeyError for another."""
    for dimension in DIMENSIONS:
        if dimension.name == name:
            return dimension
    raise KeyError(name)
