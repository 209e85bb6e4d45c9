"""JAX's persistent compilation cache, which a user may turn on
(`jax_compilation_cache_dir`, as GPU jobs often do), and the compiles
disco-xla makes.

A compile whose purpose is to make XLA dump a module (the module after SPMD
partitioning, `xla_runner.after_partitioning`) must not be served from the
cache: a cache hit compiles nothing and dumps nothing, and JAX leaves the dump
options out of the cache key. So a rerun of a sharded step with the cache on
found no module to optimise. `cache_off()` goes around the cache for such a
compile.

disco-xla's own compiles from HLO (`xla_runner`) do not go through the cache
at all: writing one to it serializes the executable, and for an
already-partitioned module compiled as replicas (the Llama-3 8B capture on 16
devices) XLA aborted the process there, a CHECK in `hlo_sharding_util` under
`PjRtLoadedExecutable::Serialize` (jaxlib 0.10.2 on the CPU). An abort cannot
be caught, and a user's job must never crash because of us.

JAX has no public way to go around its cache for one compile; `cache_off`
reaches into `jax._src.compilation_cache`, and does nothing where that module
has changed shape (the dump is then made by a compile the cache may serve).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0
_saved: tuple[bool, bool] | None = None


@contextlib.contextmanager
def cache_off() -> Iterator[None]:
    """Within this block every compile in the process skips JAX's persistent
    cache (reads and writes). Other threads' compiles skip it too while the
    block lasts, which costs them only the time of a compile."""
    global _holders, _saved
    try:
        from jax._src import compilation_cache as cache
    except ImportError:
        yield
        return
    if not hasattr(cache, "_cache_used") or not hasattr(cache, "_cache_checked"):
        yield
        return
    with _lock:
        if _holders == 0:
            _saved = (cache._cache_checked, cache._cache_used)
            cache._cache_checked, cache._cache_used = True, False
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _saved is not None:
                cache._cache_checked, cache._cache_used = _saved
                _saved = None
