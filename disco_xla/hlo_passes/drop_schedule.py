"""Pass: drop the module's instruction schedule.

A module XLA scheduled (`is_scheduled=true` in its text, the `schedule` field of
its proto) lists, per computation, the ids of its instructions in the order it
runs them. A rewrite adds and removes instructions, so that list would name ids
that no longer exist and XLA refuses the module. Without it, XLA schedules the
rewritten module itself when it compiles it, as it does any module.
"""

from __future__ import annotations

from disco_xla.hlo.graph import HloModule


class DropSchedule:
    """The pass (`pass_interface.HloPass`); it takes no configuration."""

    name = "drop-schedule"

    def run(self, module: HloModule) -> bool:
        """Clear the schedule; whether there was one."""
        if not module.proto.schedule:
            return False
        module.proto.schedule = b""
        return True
