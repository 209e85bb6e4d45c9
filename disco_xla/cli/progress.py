"""Progress bars for long work: shown on a terminal, silent otherwise or with --json."""

from __future__ import annotations

import sys

from tqdm import tqdm


class StageProgress:
    """A bar over named stages (`stage(name)` marks each start)."""

    def __init__(self, stages: list[str], quiet: bool = False):
        self._stages = stages
        self._done = 0
        self._bar = tqdm(
            total=len(stages),
            disable=quiet or not sys.stderr.isatty(),
            bar_format="{desc:<10} {bar} {n_fmt}/{total_fmt} [{elapsed}]",
            leave=False,
        )

    def stage(self, name: str) -> None:
        position = self._stages.index(name)
        self._bar.update(position - self._done)
        self._done = position
        self._bar.set_description_str(name)

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(self, *exc_info) -> None:
        self._bar.update(len(self._stages) - self._done)
        self._bar.close()
