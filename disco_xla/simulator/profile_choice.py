"""`cluster="auto"`: the shipped profile that the devices a step runs on call for.

`choose_profile` is a pure function of a `DeviceDescription` (what a process can
read of its devices: platform, device kind, devices per process, processes), so
the rule is the same on every rank and a test can map a GPU to its profile
without one. The rule:

- CPU: `cpu-local-inprocess` for one process (its devices are XLA:CPU devices
  in that process, the runtime that profile was calibrated on), `cpu-local`
  for several (`jax.distributed` processes over gloo, that profile's runtime).
  Both hold figures measured at 2 and 4 workers
  (`ClusterProfile.for_workers`), so they are not rescaled.
- A GPU whose device kind is one a shipped profile describes (`GPU_FAMILIES`):
  that profile at the job's scale, `NAME@NODESxDEVICES` (`profiles.rescaled`):
  each process taken as a node of its local devices. One process is one node:
  the GPU's NVLink-only profile where one is shipped, else its cluster profile
  with one node (the network between nodes then prices nothing). Several
  processes run over a network no device can tell: the GPU family's usual one
  is assumed (InfiniBand NDR 400G, one adapter per GPU, for H100 and H200) and
  the reason names it, with the shipped alternatives.
- Anything else (another GPU, a PCIe or NVL variant of a known one, a TPU):
  no profile, and the reason says how to write one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from disco_xla.simulator.profiles import at_scale

GPU_PLATFORMS = ("gpu", "cuda", "rocm")
MIXED_KINDS = " + "  # joins the kinds of a process whose devices differ


class NoProfileError(RuntimeError):
    """`cluster="auto"` found no cluster profile for the devices; the message
    says why and how to write one."""

    shown_whole = True  # its message says how to write a profile (`errors.one_line`)


@dataclass(frozen=True)
class DeviceDescription:
    """What a process reads of the devices it runs a step on."""

    platform: str  # JAX's `Device.platform`: 'cpu', 'gpu', 'tpu', ...
    # e.g. 'NVIDIA H100 80GB HBM3'; several kinds joined by MIXED_KINDS where
    # the process's devices differ
    device_kind: str
    local_device_count: int  # devices of this process (`jax.local_device_count()`)
    process_count: int  # processes of the job (`jax.process_count()`)

    def summary(self) -> str:
        """'8 x NVIDIA H100 80GB HBM3 per process, 4 processes', or '... in one process'."""
        devices = f"{self.local_device_count} x {self.device_kind}"
        if self.process_count == 1:
            return f"{devices} in one process"
        return f"{devices} per process, {self.process_count} processes"


@dataclass(frozen=True)
class ProfileChoice:
    """The profile `cluster="auto"` resolves to, and why."""

    cluster: str | None  # what `cluster=` becomes; None: no shipped profile fits
    reason: str  # one line: the devices read, and what was assumed

    def describe(self) -> str:
        """'profile NAME (auto: REASON)', or 'no profile (auto: REASON)'."""
        named = f"profile {self.cluster}" if self.cluster else "no profile"
        return f"{named} (auto: {self.reason})"


@dataclass(frozen=True)
class GpuFamily:
    """A GPU that shipped profiles describe, and which of them `auto` takes."""

    device_kind: re.Pattern  # matches the device kinds of this GPU (search, any case)
    one_node: str  # the profile for one process
    several_nodes: str  # the profile for several processes
    network: str  # the network `several_nodes` assumes, as the reason names it
    other_networks: tuple[str, ...] = ()  # shipped profiles of the same GPU on other networks


def _kind(pattern: str) -> re.Pattern:
    """A device-kind pattern that refuses the PCIe and NVL boards (another
    memory system and no NVSwitch: not the shipped profiles' SXM machines)."""
    return re.compile(rf"^(?!.*\b(?:PCIe|NVL)\b).*{pattern}", re.IGNORECASE)


GPU_FAMILIES: tuple[GpuFamily, ...] = (
    GpuFamily(
        _kind(r"\bH100\b"),
        one_node="h100-32x8-ib400",
        several_nodes="h100-32x8-ib400",
        network="InfiniBand NDR 400G, one adapter per GPU",
        other_networks=("h100-32x8-eth100", "h100-a3-tcpx"),
    ),
    GpuFamily(
        _kind(r"\bH200\b"),
        one_node="h200-1x8-nvlink",
        several_nodes="h200-8x8-ib400",
        network="InfiniBand NDR 400G, one adapter per GPU",
    ),
    GpuFamily(
        _kind(r"\bA100[- ]SXM4?[- ]80GB\b"),
        one_node="a100-2x8-100g",
        several_nodes="a100-2x8-100g",
        network="100 Gbit/s, one adapter per node",
    ),
    GpuFamily(
        _kind(r"\bV100[- ]SXM2\b"),
        one_node="v100-2x8-25g",
        several_nodes="v100-2x8-25g",
        network="25 Gbit/s Ethernet, one adapter per node",
    ),
)


def choose_profile(devices: DeviceDescription) -> ProfileChoice:
    """The shipped profile for `devices` (module docstring), or none and how to
    write one."""
    if devices.local_device_count < 1 or devices.process_count < 1:
        return ProfileChoice(None, f"no devices to read ({devices.summary()})")
    if MIXED_KINDS in devices.device_kind:
        return ProfileChoice(
            None,
            f"the process's devices differ ({devices.device_kind}); name a profile "
            "with cluster=... (--disco_cluster=...)",
        )
    platform = devices.platform.lower()
    if platform == "cpu":
        if devices.process_count == 1:
            return ProfileChoice(
                "cpu-local-inprocess",
                f"{devices.local_device_count} CPU devices in one process",
            )
        return ProfileChoice(
            "cpu-local", f"{devices.process_count} processes on CPU (jax.distributed)"
        )
    if platform in GPU_PLATFORMS:
        for family in GPU_FAMILIES:
            if family.device_kind.search(devices.device_kind):
                return _gpu_choice(devices, family)
    return ProfileChoice(None, _no_profile(devices))


def _gpu_choice(devices: DeviceDescription, family: GpuFamily) -> ProfileChoice:
    """`family`'s profile at the job's scale: a node per process."""
    nodes, per_node = devices.process_count, devices.local_device_count
    if nodes == 1:
        base = family.one_node
        return ProfileChoice(_scale(base, nodes, per_node), f"{devices.summary()}, one node")
    base = family.several_nodes
    alternatives = " or ".join(
        f"cluster='{_scale(other, nodes, per_node)}'" for other in family.other_networks
    )
    reason = (
        f"{devices.summary()}, a node each; network assumed {family.network}, "
        "which the devices do not tell"
    )
    if alternatives:
        reason += f" (for another, name {alternatives})"
    return ProfileChoice(_scale(base, nodes, per_node), reason)


# The shipped profiles' own topologies, (nodes, devices per node), read from
# their names ('h100-32x8-ib400': 32 nodes of 8): a profile asked for at its own
# scale is named plainly.
_NAMED_SCALE = re.compile(r"-(?P<nodes>[0-9]+)x(?P<devices_per_node>[0-9]+)-")


def _scale(profile: str, nodes: int, devices_per_node: int) -> str:
    """`profile` at `nodes` nodes of `devices_per_node` devices, as `cluster=`
    names it: its plain name at its own scale."""
    own = _NAMED_SCALE.search(profile)
    if own is not None and (int(own["nodes"]), int(own["devices_per_node"])) == (
        nodes,
        devices_per_node,
    ):
        return profile
    return at_scale(profile, nodes, devices_per_node)


def _no_profile(devices: DeviceDescription) -> str:
    """Why no shipped profile fits, and how to write one, in one line."""
    shipped = ", ".join(family.several_nodes.split("-")[0].upper() for family in GPU_FAMILIES)
    return (
        f"no shipped profile for {devices.summary()} ({devices.platform}; shipped GPUs: "
        f"{shipped} SXM); write one: copy a shipped profile's YAML from configs/clusters/, "
        "put in your device's datasheet figures and your network, and pass "
        "cluster='my.yaml' (--disco_cluster=my.yaml); `disco-xla calibrate -o my.yaml` "
        "measures CPU machines only"
    )
