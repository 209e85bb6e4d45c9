"""`disco_xla.jit`: `jax.jit` / `jax.pmap` for data-parallel training steps, running
the rewritten module that disco-xla's plan makes.

On the first call with a given argument signature (tree structure, shapes, dtypes,
shardings and static arguments) the step is lowered. If its module reduces
gradients across devices, a plan is read from the plan cache or searched, the
module is rewritten and compiled, and the rewritten program runs once beside the
original on the same arguments. If the outputs agree (the rule of
`runtime.apply.compare_outputs`), later calls run the rewritten program;
otherwise, or if anything at all fails on our side, the original runs, with one
`DiscoFallbackWarning` that says why. The first call returns the original's
result, so training never depends on an unchecked program.

Under `jax.distributed` every rank captures the module, the ranks compare its
fingerprint (a mismatch raises `AgreementError` on every rank), rank 0 finds the
plan and shares it, and the ranks agree before running the rewritten program and
again on the verdict, so all of them run the same program.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from disco_xla.planning import OptimizeSettings
from disco_xla.timing import paired_median_seconds
from disco_xla.wrapped_step import TIMING_ROUNDS, DiscoFallbackWarning, WrappedStep, slower_status

_prepared_steps = itertools.count()  # the same on every rank of an SPMD script


@dataclass
class _Compiled:
    status: str  # 'optimized', 'not data-parallel', or 'original: <reason>'
    run: Callable | None = None  # the rewritten program, when status is 'optimized'
    kept: list[int] = field(default_factory=list)
    out_tree: Any = None
    plan: Any = None
    timing: tuple[float, float] | None = None  # (original, rewritten) median seconds per step


class OptimizedFunction(WrappedStep):
    """A jitted or pmapped step that runs disco-xla's rewritten program when it
    can and the original otherwise. Call it like the original; `lower` and other
    attributes are the original's. `status()` says what each signature runs."""

    def __init__(self, lowerable: Any, settings: OptimizeSettings, static: tuple = ((), ())):
        super().__init__(lowerable, settings)
        self._static_positions, self._static_names = static
        self._warned: set[str] = set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            leaves, signature = self._signature(args, kwargs)
        except Exception:  # noqa: BLE001 - something we cannot key on: leave it to JAX
            return self._original(*args, **kwargs)
        if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
            return self._original(*args, **kwargs)  # inside an outer transformation
        compiled = self._by_signature.get(signature)
        if compiled is None:
            compiled, result = self._first_call(args, kwargs, leaves)
            self._by_signature[signature] = compiled
            return result
        if compiled.run is None:
            return self._original(*args, **kwargs)
        try:
            outputs = compiled.run([leaves[i] for i in compiled.kept])
        except Exception as error:  # noqa: BLE001 - never break training
            compiled.run, compiled.status = None, f"original: the rewritten program failed: {error}"
            _warn(self, compiled.status)
            return self._original(*args, **kwargs)
        return jax.tree_util.tree_unflatten(compiled.out_tree, outputs)

    def _signature(self, args: tuple, kwargs: dict):
        dynamic_args = tuple(a for i, a in enumerate(args) if i not in self._static_positions)
        dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_names}
        leaves, tree = jax.tree_util.tree_flatten((dynamic_args, dynamic_kwargs))
        static = tuple(args[i] for i in self._static_positions if i < len(args)) + tuple(
            sorted((k, v) for k, v in kwargs.items() if k in self._static_names)
        )
        keys = tuple(
            (
                type(leaf).__name__,
                np.shape(leaf),
                str(getattr(leaf, "dtype", "")),
                getattr(leaf, "sharding", None),
            )
            for leaf in leaves
        )
        signature = (tree, keys, static)
        hash(signature)
        return leaves, signature

    def _first_call(self, args, kwargs, leaves) -> tuple[_Compiled, Any]:
        from disco_xla.capture import lowered_module
        from disco_xla.planning import has_cross_device_all_reduces, prepared

        try:
            lowered = self._original.lower(*args, **kwargs)
            # A jit with sharded arguments: after SPMD partitioning, where its
            # gradient all-reduces are.
            module = lowered_module(lowered, f"<jax:{self.__name__}>")
            data_parallel = has_cross_device_all_reduces(module)
            if data_parallel:
                module = prepared(module)
        except Exception as error:  # noqa: BLE001
            compiled = _Compiled(f"original: could not capture the step: {_one_line(error)}")
            _warn(self, compiled.status)
            return compiled, self._original(*args, **kwargs)
        if not data_parallel:
            return _Compiled("not data-parallel"), self._original(*args, **kwargs)
        return self._optimize(module, lowered, args, kwargs, leaves)

    def _optimize(self, module, lowered, args, kwargs, leaves) -> tuple[_Compiled, Any]:
        """Find the plan, then choose, in order, the first program all ranks
        agree computes the same as the original: the whole plan; its buckets
        alone; the whole plan, or its buckets, equal to the unchanged step compiled
        the way we compile (from its HLO, combiner off: XLA's HLO-to-StableHLO
        path alone rounds some values differently from JAX's own compile, which
        Adam amplifies where a gradient is zero in exact arithmetic); else the
        original."""
        from disco_xla.plan import Plan
        from disco_xla.planning import find_plan
        from disco_xla.runtime.agreement import AgreementError, broadcast, gather
        from disco_xla.runtime.jax_program import kept_arguments

        step = next(_prepared_steps)
        wait_s = self._settings.budget_s + 600.0
        fingerprints = gather(f"step{step}/module", module.fingerprint, wait_s)
        if len(set(fingerprints)) > 1:
            raise AgreementError(
                f"{self.__name__}: the ranks captured different modules (fingerprints "
                + ", ".join(f"rank {r}: {f[:12]}" for r, f in enumerate(fingerprints))
                + "); every rank must run the same step"
            )
        compiled, problem = _Compiled("original"), ""
        try:
            plan_json = broadcast(
                f"step{step}/plan",
                lambda: find_plan(module, self._settings).plan.to_json(),
                wait_s,
            )
            compiled.plan = Plan.from_json(plan_json, f"<plan for {module.name}>")
            executable = lowered.compile()
            compiled.kept = kept_arguments(lowered)
            compiled.out_tree = lowered.out_tree
            if len(leaves) != len(jax.tree_util.tree_leaves(lowered.in_avals)):
                raise RuntimeError("the arguments do not match the lowered step")
        except Exception as error:  # noqa: BLE001 - never break training
            compiled.plan, problem = None, _one_line(error)
        trial = _Trial(self, module, lowered, compiled, leaves, step, wait_s, problem)
        trial.build_and_run(("plan",), executable if compiled.plan else None)
        result = self._original(*args, **kwargs)  # after ours: the original may donate
        if trial.agreed("plan", result, "plan~original"):
            compiled.status, compiled.run = "optimized", trial.programs["plan"]
            return self._unless_slower(compiled, trial, args, kwargs, leaves), result
        trial.build_and_run(("buckets", "reference"), executable if compiled.plan else None)
        choices = [
            ("buckets", "original", "optimized (buckets only: the plan's fusion changed results)"),
            ("plan", "reference", "optimized (equal to the unchanged step compiled from HLO)"),
            (
                "buckets",
                "reference",
                "optimized (buckets only, equal to the step compiled from HLO)",
            ),
        ]
        verdicts = trial.agreed_all(
            [(label, result if against == "original" else against) for label, against, _ in choices]
        )
        for (label, against, status), ok in zip(choices, verdicts, strict=True):
            if ok:
                if against == "reference":
                    status += _differing_from(result, trial.outputs[label])
                compiled.status, compiled.run = status, trial.programs[label]
                return self._unless_slower(compiled, trial, args, kwargs, leaves), result
        compiled.status = "original: " + trial.why()
        _warn(self, compiled.status)
        return compiled, result

    def _unless_slower(self, compiled: _Compiled, trial, args, kwargs, leaves) -> _Compiled:
        """Time the chosen program against the original, called as the user calls
        them (paired, alternating rounds; averaged over the ranks, so all decide
        alike), and keep the original if ours is not faster. Skipped when the
        original consumed (donated) its arguments."""
        from disco_xla.runtime.agreement import gather

        if not self._settings.check_speed:
            return compiled
        if any(getattr(leaf, "is_deleted", lambda: False)() for leaf in leaves):
            return compiled
        rewritten = [leaves[i] for i in compiled.kept]
        local = paired_median_seconds(
            lambda: jax.block_until_ready(self._original(*args, **kwargs)),
            lambda: jax.block_until_ready(compiled.run(rewritten)),
            TIMING_ROUNDS,
        )
        answers = gather(f"step{trial.step}/timing", f"{local[0]},{local[1]}", trial.wait_s)
        original_s = sum(float(a.split(",")[0]) for a in answers) / len(answers)
        rewritten_s = sum(float(a.split(",")[1]) for a in answers) / len(answers)
        compiled.timing = (original_s, rewritten_s)
        status = slower_status(original_s, rewritten_s, compiled.status)
        if status is not None:
            compiled.run, compiled.status = None, status
        return compiled


class _Trial:
    """The candidate programs of one first call, built, run and judged in step on
    every rank (a program with collectives runs on all ranks or on none)."""

    def __init__(self, function, module, lowered, compiled, leaves, step, wait_s, problem):
        self.function, self.module, self.lowered, self.compiled = (
            function,
            module,
            lowered,
            compiled,
        )
        self.leaves, self.step, self.wait_s = leaves, step, wait_s
        self.programs: dict[str, Any] = {}
        self.outputs: dict[str, Any] = {}
        self.problems: list[str] = [problem] if problem else []

    def build_and_run(self, labels: tuple[str, ...], executable) -> None:
        from disco_xla.planning import rewrite
        from disco_xla.runtime.agreement import gather
        from disco_xla.runtime.apply import NO_COMBINER, check_all_reduces
        from disco_xla.runtime.jax_program import standing_in_for

        built = {}
        for label in labels:
            if executable is None:
                continue
            try:
                plan = self.compiled.plan
                target = (
                    self.module
                    if label == "reference"
                    else rewrite(self.module, plan, fusion=label == "plan", check=False)
                )
                program = standing_in_for(target, self.lowered, executable, NO_COMBINER)
                if label != "reference":
                    check_all_reduces(self.module, plan, program.compiled_module())
                built[label] = program
            except Exception as error:  # noqa: BLE001
                self.problems.append(f"{label}: {_one_line(error)}")
        # Run only what every rank built.
        answers = gather(f"step{self.step}/built/{','.join(labels)}", ",".join(built), self.wait_s)
        everywhere = set.intersection(*(set(a.split(",")) - {""} for a in answers))
        if len(everywhere) < len(built) and len(answers) > 1:
            self.problems.append("another rank could not build every program")
        for label in labels:
            if label not in everywhere:
                continue
            try:
                arguments = [self.leaves[i] for i in self.compiled.kept]
                self.outputs[label] = built[label](arguments)
                self.programs[label] = built[label]
            except Exception as error:  # noqa: BLE001
                self.problems.append(f"{label} failed: {_one_line(error)}")

    def _judge(self, label: str, against) -> bool:
        if label not in self.outputs:
            return False
        expected = self.outputs.get(against) if isinstance(against, str) else against
        if expected is None:
            return False
        if isinstance(against, str):
            expected = list(expected)
        why = _difference(expected, self.outputs[label])
        if why:
            self.problems.append(f"{label}: {why}")
        return not why

    def agreed(self, label: str, against, topic: str) -> bool:
        return self.agreed_all([(label, against)], topic)[0]

    def agreed_all(self, pairs, topic: str = "choices") -> list[bool]:
        from disco_xla.runtime.agreement import gather

        local = [self._judge(label, against) for label, against in pairs]
        answers = gather(
            f"step{self.step}/verdict/{topic}",
            "".join("1" if ok else "0" for ok in local),
            self.wait_s,
        )
        return [all(answer[i] == "1" for answer in answers) for i in range(len(pairs))]

    def why(self) -> str:
        return "; ".join(dict.fromkeys(self.problems)) or "no program agreed with the original"


def _difference(original_result: Any, rewritten_outputs: list) -> str:
    """Why the rewritten outputs do not count as equal to the original's ('' if they do)."""
    from disco_xla.runtime.apply import compare_outputs

    try:
        verdict = compare_outputs(
            _local(jax.tree_util.tree_leaves(original_result)), _local(rewritten_outputs)
        )
    except Exception as error:  # noqa: BLE001
        return "could not compare the outputs: " + _one_line(error)
    if verdict.equal:
        return ""
    return (
        "the rewritten program's outputs differ from the original's (max relative "
        f"difference {verdict.max_rel_diff:.3g})"
    )


def _failures(answers: list[str]) -> list[str]:
    """The answers that are not 'ok', with their rank when there are several."""
    return [
        answer if len(answers) == 1 else f"rank {rank}: {answer}"
        for rank, answer in enumerate(answers)
        if answer != "ok"
    ]


def _differing_from(original_result: Any, rewritten_outputs: list) -> str:
    """Which of this process's outputs differ from JAX's own program, by pytree
    path: XLA's HLO-to-StableHLO import rounds some values differently (e.g. the
    softmax's division), which Adam scales up where a gradient is 0 in exact
    arithmetic (benchmarks/jax_compile_equality.py)."""
    from disco_xla.runtime.apply import differing_outputs

    paths = [
        jax.tree_util.keystr(path)
        for path, _ in jax.tree_util.tree_flatten_with_path(original_result)[0]
    ]
    expected = [_local([leaf]) for leaf in jax.tree_util.tree_leaves(original_result)]
    got = [_local([array]) for array in rewritten_outputs]
    # One entry per leaf: its shards side by side.
    found = differing_outputs(
        [np.stack(shards) for shards in expected], [np.stack(shards) for shards in got]
    )
    if not found:
        return ""
    names = ", ".join(paths[i] for i in found[:8]) + (", ..." if len(found) > 8 else "")
    return f"; differs from JAX's own program in {len(found)} outputs: {names}"


def _local(arrays) -> list[np.ndarray]:
    """This process's shards of each array, in device order."""
    return [np.asarray(shard.data) for array in arrays for shard in array.addressable_shards]


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]


def _warn(function: OptimizedFunction, why: str) -> None:
    """One warning per function and reason (a new signature with the same problem
    does not warn again)."""
    why = why.removeprefix("original: ")
    if why in function._warned:
        return
    function._warned.add(why)
    warnings.warn(
        f"disco_xla.jit({function.__name__}) runs the original program: {why}",
        DiscoFallbackWarning,
        stacklevel=4,
    )


def jit(
    fn: Callable | None = None,
    *,
    cluster: str = "cpu-local",
    budget_s: float = 30.0,
    max_evaluations: int = 300,
    seed: int = 0,
    cost_model: str = "roofline",
    cache_dir: str | None = None,
    use_cache: bool = True,
    check_speed: bool = True,
    **jit_kwargs: Any,
) -> Any:
    """Like `jax.jit(fn, **jit_kwargs)`, for a data-parallel training step, with
    disco-xla's plan for `cluster` applied. `fn` may already be transformed
    (`jax.pmap(step, axis_name=...)`, `jax.jit(shard_map(...))`), in which case no
    jit keyword arguments are taken. Usable as `@disco_xla.jit` or
    `@disco_xla.jit(cluster=...)`."""
    settings_arguments = dict(
        cluster=cluster,
        budget_s=budget_s,
        max_evaluations=max_evaluations,
        seed=seed,
        cost_model=cost_model,
        cache_dir=cache_dir,
        use_cache=use_cache,
        check_speed=check_speed,
    )
    if fn is None:
        return functools.partial(jit, **settings_arguments, **jit_kwargs)
    settings = OptimizeSettings(**settings_arguments)
    return wrap(fn, settings, "jit", jit_kwargs)


def wrap(
    fn: Callable, settings: OptimizeSettings, transform: str, kwargs: dict
) -> OptimizedFunction:
    """`fn` under `transform` ('jit' or 'pmap', JAX's own, with `kwargs`) unless it
    is transformed already, as an OptimizedFunction."""
    from jax._src import api, pmap

    if hasattr(fn, "lower"):
        if kwargs:
            raise TypeError("a function that is already transformed takes no jit arguments")
        return OptimizedFunction(fn, settings)
    if transform == "pmap":
        lowerable = pmap.pmap(fn, **kwargs)
        static = (_positions(kwargs.get("static_broadcasted_argnums", ())), ())
    else:
        lowerable = api.jit(fn, **kwargs)
        static = (
            _positions(kwargs.get("static_argnums", ())),
            _names(kwargs.get("static_argnames", ())),
        )
    return OptimizedFunction(lowerable, settings, static)


def _positions(value) -> tuple[int, ...]:
    return (value,) if isinstance(value, int) else tuple(value or ())


def _names(value) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value or ())
