"""What `disco_xla.jit` and `disco_xla.tf_function` share: a wrapped training step
that keeps the original, the settings, and one record per argument signature
(what it runs, and with which plan), the cluster profile its plans are priced
on (`cluster="auto"` read from the devices on the first call), and the warning
they give when they run the original because something failed. Their trial is
`trial.Trial`."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any

from disco_xla.errors import one_line
from disco_xla.settings import AUTO_CLUSTER, OptimizeSettings
from disco_xla.simulator.profile_choice import (
    DeviceDescription,
    NoProfileError,
    ProfileChoice,
    choose_profile,
)


class DiscoFallbackWarning(RuntimeWarning):
    """disco-xla runs the original program, for the reason given."""


class WrappedStep:
    """A step that runs disco-xla's rewritten program when it can and the
    original otherwise. Call it like the original; other attributes are the
    original's. A record per signature has at least `status` and `plan`."""

    def __init__(self, original: Any, settings: OptimizeSettings):
        self._original = original
        self._settings = settings
        self._by_signature: dict[Any, Any] = {}
        self._warned: set[str] = set()
        self._profile_choice: ProfileChoice | None = None  # what "auto" resolved to
        functools.update_wrapper(self, original, updated=())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)

    def profile(self) -> str:
        """The cluster profile the plans are priced on, and why: 'profile NAME
        (auto: REASON)' where `cluster="auto"` read it from the devices,
        'profile NAME (named)' where the caller named it."""
        if self._profile_choice is not None:
            return self._profile_choice.describe()
        if self._settings.cluster == AUTO_CLUSTER:
            return "profile auto (the devices are read on the first call)"
        return f"profile {self._settings.cluster} (named)"

    def _resolve_cluster(self, read_devices: Callable[[], DeviceDescription]) -> None:
        """Where the settings say `cluster="auto"`, read the devices once and put
        the profile they call for in its place (`choose_profile`): every later
        search, cache key and measurement names that profile. Where none fits,
        the settings keep "auto" and planning refuses (`_planning_settings`)."""
        if self._settings.cluster != AUTO_CLUSTER or self._profile_choice is not None:
            return
        try:
            choice = choose_profile(read_devices())
        except Exception as error:  # noqa: BLE001 - never break training
            choice = ProfileChoice(None, f"could not read the devices: {one_line(error)}")
        self._profile_choice = choice
        if choice.cluster is not None:
            self._settings = dataclasses.replace(self._settings, cluster=choice.cluster)

    def _planning_settings(self) -> OptimizeSettings:
        """The settings a data-parallel signature's plan is found with. Raises
        NoProfileError where `cluster="auto"` found no profile for the devices
        (the signature then runs the original, its status saying why)."""
        if self._settings.cluster == AUTO_CLUSTER:
            raise NoProfileError(self.profile())
        return self._settings

    def status(self) -> list[str]:
        """What each signature seen so far runs, in the order they were seen:
        'optimized ...', 'not data-parallel', or 'original: <why>'."""
        return [record.status for record in self._by_signature.values()]

    def plans(self) -> list:
        """The plans found so far, one per optimised signature."""
        return [r.plan for r in self._by_signature.values() if r.plan is not None]

    def measurements(self) -> list[dict]:
        """Per signature seen so far: each candidate program's label mapped to
        what the first call found of it: 'simulated_s' (the simulator's step
        time, where the search gave one), 'equal' (its outputs against the
        original's), 'measured_s' (its median step time, timed beside the
        original's, which is under 'original'), 'peak_bytes' (XLA's count of the
        most buffer bytes the compiled program holds on one device: arguments,
        results and temporaries, less what donated arguments' buffers are
        reused for), or 'same_as' (the label of the same program) or 'error';
        and 'chosen' under the label it runs. A label
        tried (or, for 'original', run) only because an earlier measured run
        on this machine chose it, as the plan cache recorded, has 'from_cache'."""
        return [dict(getattr(r, "candidates", {})) for r in self._by_signature.values()]

    def _warn(self, api: str, why: str, stacklevel: int, once: bool = False) -> None:
        """The fallback warning: `api` (e.g. 'jit') runs the original for `why`,
        pointing `stacklevel` frames up. With `once`, a reason this function
        has already warned of (for another signature) is not repeated."""
        why = why.removeprefix("original: ")
        if once and why in self._warned:
            return
        self._warned.add(why)
        warnings.warn(
            f"disco_xla.{api}({self.__name__}) runs the original program: {why}",
            DiscoFallbackWarning,
            stacklevel=stacklevel + 1,
        )
