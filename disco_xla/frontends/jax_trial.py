"""The JAX side of a step's trial (`trial.Trial`): the candidate programs of
one argument signature compiled as JAX executables standing in for the step,
run on copies of the user's arguments (the original runs once, last, on the
user's own arguments, and may consume them), judged against the original, and
timed; and the agreement of every rank of a `jax.distributed` job on each of
those steps, so that all of them run the same program.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from disco_xla.driver.checked_rewrite import rewrite
from disco_xla.driver.plan_cache import CandidateRecord, PlanCache
from disco_xla.driver.planning import PlanChoice, find_plan
from disco_xla.driver.signature_record import SignatureRecord
from disco_xla.driver.trial import Trial
from disco_xla.runtime.agreement import AgreementError, broadcast, gather, process_count
from disco_xla.runtime.collective_census import check_collectives
from disco_xla.runtime.jax_program import check_memory, peak_bytes, standing_in_for, with_aliases_of
from disco_xla.runtime.output_comparison import compare_outputs, differing_outputs
from disco_xla.runtime.xla_runner import NO_COMBINER, compile_separately
from disco_xla.settings import OptimizeSettings

if TYPE_CHECKING:
    from disco_xla.frontends.jax_api import OptimizedFunction


@dataclass
class JaxSignatureRecord(SignatureRecord):
    """A `SignatureRecord` of a JAX step: which argument leaves the program
    takes, which donated leaves it leaves alive, and its output tree."""

    kept: list[int] = field(default_factory=list)
    delete_after: list[int] = field(default_factory=list)  # donated leaves `run` leaves alive
    # `run` behind JAX's own dispatch (`RewrittenStep.behind_jax_dispatch`),
    # called as the step's compiled form is: where it has one, and `run`
    # deletes no leaf by hand
    behind_jax: Any = None
    behind_jax_tree: Any = None  # the argument tree `behind_jax` takes
    out_tree: Any = None
    # (seconds, when it ended) of the signature's first call, while the
    # background work waits for the run to be long enough (`start_after`)
    first_call: tuple[float, float] | None = None


def waiting_s(settings: OptimizeSettings) -> float:
    """How long a rank waits for the others' answers: the search, the
    measuring and a compile's worth more."""
    return settings.budget_s + settings.measure_budget_s + 600.0


def agree_on_module(name: str, module, step: int, wait_s: float) -> None:
    """Raise AgreementError on every rank unless all captured the same module
    (every rank then runs the original, as the script wrote it)."""
    fingerprints = gather(f"step{step}/module", module.fingerprint, wait_s)
    if len(set(fingerprints)) > 1:
        raise AgreementError(
            f"{name}: the ranks captured different modules (fingerprints "
            + ", ".join(f"rank {r}: {f[:12]}" for r, f in enumerate(fingerprints))
            + "); every rank must run the same step"
        )


def shared_choice(module, settings: OptimizeSettings, step: int, wait_s: float):
    """Rank 0's `PlanChoice` (from its cache or its search), on every rank."""

    def found() -> str:
        choice = find_plan(module, settings, compile_separately)
        return json.dumps({"key": choice.cache_key, "record": choice.candidates.to_json()})

    shared = json.loads(broadcast(f"step{step}/plan", found, wait_s))
    record = CandidateRecord.from_json(shared["record"], f"<plan for {module.name}>")
    return PlanChoice(record.plans["plan"], True, 0.0, record, shared["key"])


def traced_step_key(lowered, settings: OptimizeSettings) -> str:
    """The plan cache's key for a traced step under `settings`: its lowered
    program's text (known before anything is compiled or captured), the
    cluster and the search options."""
    options = json.dumps({"cluster": settings.cluster, **settings.search_options()}, sort_keys=True)
    return hashlib.sha256((lowered.as_text() + options).encode()).hexdigest()


def remember_traced_step(lowered, settings: OptimizeSettings, choice) -> None:
    """Rank 0 records, beside `choice`'s plan, that this traced step has it
    (`recorded_choice` reads it on a later first call)."""
    if settings.use_cache and choice.cache_key and jax.process_index() == 0:
        PlanCache(settings.cache_dir).put_traced_step(
            traced_step_key(lowered, settings), choice.cache_key
        )


def recorded_choice(function: OptimizedFunction, call: CallArguments) -> CandidateRecord | None:
    """For a first call: the plan cache's record of the step's candidates, when
    it holds a measured choice for it (else None, and nothing is lowered when
    the cache records no traced step at all)."""
    settings = function._settings
    if not settings.use_cache:
        return None
    cache = PlanCache(settings.cache_dir)  # one instance: each opens the file anew
    if not cache.has_traced_steps():
        return None
    lowered = function._original.lower(*call.args, **call.kwargs)
    record = cache.traced_step_record(traced_step_key(lowered, settings))
    return record if record is not None and record.chosen is not None else None


def deleted(leaf) -> bool:
    return getattr(leaf, "is_deleted", lambda: False)()


def donation_note(call: CallArguments) -> str:
    """'; donates args[0], opt_state' for a step whose original consumed those
    arguments on the first call (each named by its position or keyword, as the
    user passes it), else ''."""
    if not any(call.donated):
        return ""
    args, kwargs = jax.tree_util.tree_unflatten(call.tree, call.donated)
    names = [f"args[{i}]" for i, part in enumerate(args) if any(jax.tree_util.tree_leaves(part))]
    names += [name for name, part in kwargs.items() if any(jax.tree_util.tree_leaves(part))]
    return f"; donates {', '.join(names)}"


def _fresh_copy(leaf):
    """A copy of a device array in its own buffers, laid out and committed to
    its devices as the original (JAX refuses a committed array on other
    devices than a step's)."""
    if not isinstance(leaf, jax.Array):
        return leaf  # a host value: a step cannot consume it
    return jnp.array(leaf, copy=True)


class CallArguments:
    """The arguments of a first call. The step may donate some of them: JAX
    deletes a donated array when the call is made (and `args_info` does not
    always say which: a pmap's counts `donate_argnums` as leaf positions). So
    every run of the trial but one takes fresh copies of the arguments, copied
    from one set saved before anything runs, and the original runs once on the
    user's own arguments (`original`), giving the result the user gets; the
    arguments it deleted are the donated ones."""

    def __init__(self, function: OptimizedFunction, args: tuple, kwargs: dict, leaves, tree):
        self.function, self.args, self.kwargs = function, args, kwargs
        self.leaves, self.tree = list(leaves), tree
        self.donated = [False] * len(self.leaves)  # known once the original has run
        self.result: Any = None  # the original's result, once it has run
        self._saved: list | None = None

    def _save(self) -> list:
        if self._saved is None:
            self._saved = [_fresh_copy(leaf) for leaf in self.leaves]
        return self._saved

    def fresh_leaves(self) -> list:
        """Every argument leaf as a new copy (a program may consume it)."""
        return [_fresh_copy(leaf) for leaf in self._save()]

    def original(self, keep_copies: bool = True) -> Any:
        """Run the original step on the user's own arguments (which it may
        consume), once, and keep its result and what it donated; with
        `keep_copies`, copies of the arguments are saved first, for runs after."""
        if keep_copies:
            self._save()
        self.result = self.function._original(*self.args, **self.kwargs)
        self.donated = [deleted(leaf) for leaf in self.leaves]
        return self.result

    def original_on(self, leaves: list) -> Any:
        """Run the original on `leaves` (e.g. `fresh_leaves()`)."""
        args, kwargs = self.function._with_leaves(self.args, self.kwargs, self.tree, leaves)
        return self.function._original(*args, **kwargs)

    def release(self) -> None:
        """Drop the saved copies (the trial is over)."""
        self._saved = None


class JaxTrial(Trial):
    """The trial of a JAX step's candidates: each rewritten module compiled to
    stand in for the lowered step (with the input/output aliases of XLA's own
    compile of it), run on fresh copies of the arguments, in step with every
    other rank (a program with collectives runs on all ranks or on none). When
    no candidate computes what JAX's program does, they are judged against the
    unchanged step compiled from its HLO the way they are (the reference): XLA's
    HLO-to-StableHLO import alone rounds some values differently from JAX's own
    compile, which Adam amplifies where a gradient is 0 in exact arithmetic."""

    uses_reference = True

    def __init__(
        self,
        function: OptimizedFunction,
        module,
        choice,
        lowered,
        executable,
        record: JaxSignatureRecord,
        step: int,
        problem: str = "",
    ):
        super().__init__(module, choice, function._settings, problem)
        self.function, self.lowered, self.executable = function, lowered, executable
        self.record, self.step = record, step
        self.wait_s = waiting_s(function._settings)
        self.call: CallArguments | None = None  # the call the programs run on
        self.deleted_by: dict[str, set[int]] = {}  # label -> the argument leaves it consumed
        self.can_build = executable is not None

    def _gather(self, topic: str, value: str) -> list[str]:
        return gather(f"step{self.step}/{topic}", value, self.wait_s)

    def _broadcast(self, topic: str, make) -> str:
        return broadcast(f"step{self.step}/{topic}", make, self.wait_s)

    def _records_choices(self) -> bool:
        return jax.process_index() == 0

    def _rewritten(self, plan, fusion: bool):
        return rewrite(self.module, plan, fusion, check=False)

    def _compile(self, label: str, module, plan):
        executable = self.executable
        aliased = with_aliases_of(module, executable)
        program = standing_in_for(aliased, self.lowered, executable, NO_COMBINER)
        original_stats, stats = executable.memory_analysis(), program.memory_stats()
        self.peak_bytes.setdefault("original", peak_bytes(original_stats))
        self.peak_bytes[label] = peak_bytes(stats)
        check_memory(original_stats, stats)
        if plan is not None:
            check_collectives(self.module, plan, program.compiled_module())
        return program

    def _run(self, label: str, program):
        fresh = self.call.fresh_leaves()
        # Waited for: in-process collectives dispatched back to back can
        # deadlock on a few cores (README).
        outputs = jax.block_until_ready(program([fresh[i] for i in self.record.kept]))
        self.deleted_by[label] = {i for i, leaf in enumerate(fresh) if deleted(leaf)}
        return outputs

    def _run_original(self):
        # Copies of the arguments are saved first when programs run after it.
        result = self.call.original(keep_copies=bool(self.order))
        return result, result

    def _compare(self, expected, outputs):
        return compare_outputs(_local(jax.tree_util.tree_leaves(expected)), _local(list(outputs)))

    def _refusal(self, label: str) -> str:
        if self.deleted_by[label] - self.donated():
            return "it consumes arguments that the original keeps"
        return ""

    def _differing(self, label: str) -> str:
        return _differing_from(self.original_result, self.outputs[label])

    def _timed_calls(self, labels: list[str]):
        kept = self.record.kept
        calls = {"original": lambda leaves: jax.block_until_ready(self.call.original_on(leaves))}
        for label in labels:
            program = self.programs[label]
            calls[label] = lambda leaves, program=program: jax.block_until_ready(
                program([leaves[i] for i in kept])
            )
        return calls, self.call.fresh_leaves

    def _install(self, record, chosen: str) -> None:
        record.run = self.programs[chosen]
        record.delete_after = self.left_to_delete(chosen)
        record.behind_jax = None
        if not record.delete_after and process_count() == 1:
            try:
                record.behind_jax = record.run.behind_jax_dispatch(self.executable)
                record.behind_jax_tree = record.behind_jax and record.behind_jax.in_tree
            except Exception:  # noqa: BLE001 - then our own dispatch runs it
                record.behind_jax = None

    def donated(self) -> set[int]:
        """The argument leaves the original consumed."""
        return {i for i, donated in enumerate(self.call.donated) if donated}

    def left_to_delete(self, label: str) -> list[int]:
        """The argument leaves the original consumes and `label`'s program does
        not (a donated argument XLA could not alias): deleted after each run,
        so the user's loop sees JAX's own behaviour."""
        return sorted(self.donated() - self.deleted_by.get(label, set()))


def _differing_from(original_result: Any, rewritten_outputs: list) -> str:
    """Which of this process's outputs differ from JAX's own program, by pytree
    path: XLA's HLO-to-StableHLO import rounds some values differently (e.g. the
    softmax's division), which Adam scales up where a gradient is 0 in exact
    arithmetic (benchmarks/jax_compile_equality.py)."""
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
