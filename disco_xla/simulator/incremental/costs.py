"""What the plans of one search share: kernel durations cached by fusion group,
and the figures of the module that no plan changes."""

from __future__ import annotations

from disco_xla.hlo.graph import HloModule
from disco_xla.plan import bucket_kinds, gradient_dependencies
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.events import to_ps
from disco_xla.simulator.kernels import TaskGraph, group_kernel
from disco_xla.simulator.module_index import module_index
from disco_xla.simulator.plan_kernels import KernelPart, group_parts


class GroupCosts:
    """Kernel durations in picoseconds, cached by fusion group, and each group's
    halves (shared by the states of one search)."""

    def __init__(self, module: HloModule, cost_model: CostModel, kernel_time_scale: float = 1.0):
        self.module = module
        self.index = module_index(module)
        self.cost_model = cost_model
        # The profile's factor on every kernel time, applied as `simulate` does.
        self.kernel_time_scale = kernel_time_scale
        self.cache: dict[tuple[str, ...], int] = {}
        self._halves: dict[tuple[str, ...], tuple[tuple[str, ...], tuple[str, ...]]] = {}

    def durations(self, groups: list[tuple[str, ...]]) -> list[int]:
        """Each group's kernel duration in ps (one run of one instance)."""
        missing = list(dict.fromkeys(g for g in groups if g not in self.cache))
        if missing:
            kernels = [group_kernel(self.index, g, g[0]) for g in missing]
            seconds = self.cost_model.kernels_s(TaskGraph(kernels, [], [], []))
            scale = self.kernel_time_scale
            for group, value in zip(missing, seconds, strict=True):
                self.cache[group] = to_ps(value * scale if scale != 1.0 else value)
        return [self.cache[g] for g in groups]

    def kernel_parts(self, group: tuple[str, ...]) -> tuple[KernelPart, ...]:
        """`plan_kernels.group_parts` of the group."""
        return group_parts(self.index, group)

    def halves(self, group: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The group's instructions in module order, cut in the middle."""
        found = self._halves.get(group)
        if found is None:
            members = sorted(group, key=self.index.name_position.__getitem__)
            middle = len(members) // 2
            found = self._halves[group] = (tuple(members[:middle]), tuple(members[middle:]))
        return found


def gradient_dependencies_of(module: HloModule) -> dict[str, frozenset[str]]:
    """`plan.gradient_dependencies`, computed once per module (`HloModule.analyses`)."""
    return module.analyses.get(gradient_dependencies, lambda: gradient_dependencies(module))


def bucket_kinds_of(module: HloModule) -> dict[str, tuple]:
    """`plan.bucket_kinds`, computed once per module (`HloModule.analyses`)."""
    return module.analyses.get(bucket_kinds, lambda: bucket_kinds(module))
