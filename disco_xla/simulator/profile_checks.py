"""Checks of a profile's values, shared by its sections (`profiles`,
`gpu_profile`): each bad value is a one-line DiscoInputError naming the file."""

from __future__ import annotations

from disco_xla.errors import DiscoInputError


def positive(mapping: dict, key: str, where: str, source: str, allow_zero: bool = False) -> float:
    value = mapping.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DiscoInputError(source, f"bad or missing key '{where}.{key}': expected a number")
    if value < 0 or (value == 0 and not allow_zero):
        raise DiscoInputError(source, f"bad key '{where}.{key}': must be positive")
    return float(value)


def number_map(mapping: dict, key: str, where: str, source: str) -> dict[str, float]:
    values = mapping.get(key)
    if not isinstance(values, dict) or not values:
        raise DiscoInputError(
            source, f"bad or missing key {where!r}: expected a mapping of numbers"
        )
    return {str(k): positive(values, k, where, source) for k in values}
