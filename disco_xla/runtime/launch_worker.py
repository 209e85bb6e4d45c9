"""One rank of `disco-xla launch`: join the job, then run the script as `__main__`."""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time
import traceback

import jax

from disco_xla.runtime.launch import COORDINATOR_VARIABLE, PROCESSES_VARIABLE, RANK_VARIABLE


def _exit_with_the_launcher() -> None:
    """If the launcher dies (killed, say), this rank must not live on alone."""
    launcher = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(1.0)
        _leave_now(1)

    threading.Thread(target=watch, daemon=True).start()


def main() -> None:
    _exit_with_the_launcher()
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        os.environ[COORDINATOR_VARIABLE],
        num_processes=int(os.environ[PROCESSES_VARIABLE]),
        process_id=int(os.environ[RANK_VARIABLE]),
        initialization_timeout=120,
    )
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            _leave_now(stop.code if isinstance(stop.code, int) else 1)
    except BaseException:  # noqa: BLE001 - whatever it was, this rank is done
        traceback.print_exc()
        _leave_now(1)
    jax.distributed.shutdown()


def _leave_now(code: int) -> None:
    """Exit without jax.distributed.shutdown(), which waits for every other rank:
    a failed rank must end at once so the launcher can stop the rest."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
