"""What every plan of one module shares, for building its task graph: the
module's atoms (compute instructions and collectives, once per instance of
their computation), what each waits for, and each instruction's bytes and
FLOPs, built once per module (`module_index`)."""

from __future__ import annotations

from functools import cached_property

from disco_xla.hlo.graph import COLLECTIVE_OPCODES, HloModule, Instruction
from disco_xla.hlo.trip_counts import runs_per_call
from disco_xla.plan import fusion_weight, is_compute

CONTROL_CALLS = frozenset({"call", "while", "conditional"})
# The chain of call sites (instruction names) that tells instances of a
# computation called from several places apart; () for computations run once.
CallKey = tuple[str, ...]


class ModuleIndex:
    """What every plan of one module shares, built once per module.

    An atom is a compute instruction or a collective (all-reduce, all-gather,
    reduce-scatter, ...; an asynchronous one by its start) in one instance of its
    computation. For each atom: the atoms its value waits for (`inputs`, through
    parameters, tuples and calls), those of them reached only through an
    instruction that is not a compute instruction (`indirect_inputs`: fusing
    across such an edge would make a cycle), and the compute atoms it waits for
    once all-reduces are seen through (`order_inputs`, for the kernel order).
    """

    def __init__(self, module: HloModule):
        self.module = module
        self.by_name: dict[str, Instruction] = {i.name: i for i in module.instructions()}
        self._bytes: dict[int, int] = {}
        self._flops: dict[int, int] = {}
        # (group, label) -> its Kernel, built once (`group_kernel`)
        self.kernels_built: dict[tuple[tuple[str, ...], str], object] = {}
        self.instances: dict[str, list[CallKey]] = {}
        self._parents: dict[tuple[str, CallKey], list[tuple[Instruction, CallKey]]] = {}
        self._enumerate_instances()
        self.runs = self._instance_runs()
        self.position: dict[int, int] = {}
        counter = 0
        for computation in module.computations:
            for instr in computation.topological_order:
                self.position[id(instr)] = counter
                counter += 1
        self.atoms: list[tuple[Instruction, CallKey]] = []
        self.atom_of: dict[tuple[int, CallKey], int] = {}
        self.atoms_of_name: dict[str, list[int]] = {}
        self.is_compute: list[bool] = []
        for computation in module.computations:
            if computation.role not in ("entry", "program"):
                continue
            for key in self.instances.get(computation.name, [()]):
                for instr in computation.topological_order:
                    compute = is_compute(instr)
                    if not compute and instr.opcode not in COLLECTIVE_OPCODES:
                        continue
                    atom = len(self.atoms)
                    self.atoms.append((instr, key))
                    self.atom_of[(id(instr), key)] = atom
                    self.atoms_of_name.setdefault(instr.name, []).append(atom)
                    self.is_compute.append(compute)
        self._resolve()

    def _enumerate_instances(self) -> None:
        module = self.module
        seen: set[tuple[str, CallKey]] = set()
        stack: list[tuple] = [(module.entry, ())]
        while stack:
            computation, key = stack.pop()
            if (computation.name, key) in seen:
                continue
            seen.add((computation.name, key))
            self.instances.setdefault(computation.name, []).append(key)
            for instr in reversed(computation.instructions):
                if instr.opcode not in CONTROL_CALLS:
                    continue
                for callee in instr.called_computations:
                    child = key + (instr.name,) if len(callee.callers) > 1 else key
                    self._parents.setdefault((callee.name, child), []).append((instr, key))
                    stack.append((callee, child))
        for computation in module.computations:
            if computation.role in ("entry", "program") and computation.name not in self.instances:
                self.instances[computation.name] = [()]
        for keys in self.instances.values():
            keys.sort()

    def _instance_runs(self) -> dict[tuple[str, CallKey], int]:
        """How many times each instance of a computation runs in one step: the
        sum over its call sites of the caller's runs times the runs per call
        (`trip_counts.runs_per_call`: a loop body once per trip; 0 for a loop
        known never to run)."""
        runs: dict[tuple[str, CallKey], int] = {(self.module.entry.name, ()): 1}
        parents = self._parents

        def count(instance: tuple[str, CallKey]) -> int:
            found = runs.get(instance)
            if found is None:
                runs[instance] = 0  # guards against a cycle through calls
                callers = parents.get(instance)
                found = 0 if callers else 1  # a computation nothing calls counts once
                for instr, parent_key in callers or ():
                    callee = next(c for c in instr.called_computations if c.name == instance[0])
                    found += count((instr.computation.name, parent_key)) * runs_per_call(
                        instr, callee
                    )
                runs[instance] = found
            return found

        for name, keys in self.instances.items():
            for key in keys:
                count((name, key))
        return runs

    def instance_runs(self, instr: Instruction, key: CallKey) -> int:
        """How many times `instr`, in the instance `key` of its computation, runs
        in one step."""
        return self.runs.get((instr.computation.name, key), 1)

    def name_runs(self, name: str) -> int:
        """How many times the collective or compute instruction `name` runs in
        one step, over all the instances of its computation."""
        return sum(self.instance_runs(*self.atoms[a]) for a in self.atoms_of_name[name])

    def _sources(self, instr: Instruction, key: CallKey) -> list[tuple[Instruction, CallKey]]:
        """What `instr` (in the instance `key` of its computation) reads."""
        sources = [(i, key) for i in instr.operands + instr.control_predecessors]
        if instr.opcode == "get-tuple-element" and instr.operands:
            # An element of a tuple or of a call's tuple result: just that element.
            operand, element = instr.operands[0], instr.proto.tuple_index
            elementwise_tuple = operand.opcode == "tuple" or (
                operand.opcode == "custom-call"
                and operand.proto.custom_call_target.startswith("xla.sdy.")
                and len(operand.operands) == len(operand.shape.tuple_shapes) > 1
            )  # Shardy's shape markers map operand i to element i
            if elementwise_tuple and element < len(operand.operands):
                sources[0] = (operand.operands[element], key)
            elif operand.opcode == "call" and len(operand.called_computations) == 1:
                callee = operand.called_computations[0]
                root = callee.root
                if root.opcode == "tuple" and element < len(root.operands):
                    child = key + (operand.name,) if len(callee.callers) > 1 else key
                    sources[0] = (root.operands[element], child)
        elif instr.opcode == "parameter":
            number = instr.proto.parameter_number
            for caller, parent_key in self._parents.get((instr.computation.name, key), ()):
                if caller.opcode == "conditional":  # branch k reads operand k + 1
                    sources += [
                        (caller.operands[1 + branch], parent_key)
                        for branch, c in enumerate(caller.called_computations)
                        if c is instr.computation and 1 + branch < len(caller.operands)
                    ]
                elif number < len(caller.operands):
                    sources.append((caller.operands[number], parent_key))
        elif instr.opcode in CONTROL_CALLS:
            for callee in instr.called_computations:
                child = key + (instr.name,) if len(callee.callers) > 1 else key
                sources.append((callee.root, child))
        return sources

    def _resolve(self) -> None:
        """Fill in, for each atom, what it waits for: `inputs`, `indirect_inputs`
        and `direct_users` (`_resolve_inputs`), then `order_inputs` and
        `order_users` (`_resolve_order_inputs`), and `is_expensive`."""
        self._resolve_inputs()
        self._resolve_order_inputs()
        self.is_expensive = [fusion_weight(i) for i, _ in self.atoms]

    def _upstream(
        self,
        node: Instruction,
        key: CallKey,
        memo: dict[tuple[int, CallKey], frozenset[int]],
    ) -> frozenset[int]:
        """Atoms that a non-atom instruction's value waits for (iterative DFS
        through `_sources`, stopping at atoms); `memo` keeps each instruction's
        answer for the next call."""
        atom_of = self.atom_of
        top = (id(node), key)
        if top in memo:
            return memo[top]
        stack = [(node, key, None)]
        while stack:
            current, ckey, pending = stack[-1]
            mark = (id(current), ckey)
            if pending is None:
                pending = self._sources(current, ckey)
                stack[-1] = (current, ckey, pending)
                missing = [
                    (s, k)
                    for s, k in pending
                    if (id(s), k) not in atom_of and (id(s), k) not in memo
                ]
                if missing:
                    memo[mark] = frozenset()  # guards against a cycle through calls
                    stack.extend((s, k, None) for s, k in missing)
                    continue
            found: set[int] = set()
            for s, k in pending:
                atom = atom_of.get((id(s), k))
                if atom is not None:
                    found.add(atom)
                else:
                    found |= memo.get((id(s), k), frozenset())
            memo[mark] = frozenset(found)
            stack.pop()
        return memo[top]

    def _resolve_inputs(self) -> None:
        """Each atom's `inputs` and `indirect_inputs`, and each compute atom's
        `direct_users`: a source is direct when it is a compute atom read through
        an operand edge in the same instance, indirect otherwise."""
        memo: dict[tuple[int, CallKey], frozenset[int]] = {}
        atom_of = self.atom_of
        self.inputs: list[frozenset[int]] = []
        self.indirect_inputs: list[frozenset[int]] = []
        # Compute atoms that read each atom through an operand edge of their own.
        self.direct_users: list[list[int]] = [[] for _ in self.atoms]
        for atom, (instr, key) in enumerate(self.atoms):
            direct: set[int] = set()
            indirect: set[int] = set()
            for source, skey in self._sources(instr, key):
                found = atom_of.get((id(source), skey))
                if found is None:
                    indirect |= self._upstream(source, skey, memo)
                elif self.is_compute[found] and skey == key:
                    direct.add(found)
                else:
                    indirect.add(found)
            direct.discard(atom)
            indirect.discard(atom)
            self.inputs.append(frozenset(direct | indirect))
            self.indirect_inputs.append(frozenset(indirect))
            for source in direct:
                self.direct_users[source].append(atom)

    def _resolve_order_inputs(self) -> None:
        """Each atom's `order_inputs` (the compute atoms it waits for, with
        all-reduces seen through) and each compute atom's `order_users` (the
        compute atoms that wait for it)."""
        through = self.through_cache = {}
        for atom in range(len(self.atoms)):  # atoms are in topological order per instance
            if not self.is_compute[atom]:
                through[atom] = self._through(atom, through)
        self.order_inputs: list[frozenset[int]] = []
        self.order_users: list[list[int]] = [[] for _ in self.atoms]
        for atom, inputs in enumerate(self.inputs):
            found = set()
            for source in inputs:
                if self.is_compute[source]:
                    found.add(source)
                else:
                    found |= self._through(source, through)
            if self.is_compute[atom]:
                for source in found:
                    self.order_users[source].append(atom)
            self.order_inputs.append(frozenset(found))

    @cached_property
    def late_read_rank(self) -> list[int]:
        """For each atom, how late the all-reduce results it reads are ready: one
        more than the largest atom number (a topological position) among the
        atoms that feed those all-reduces; 0 for an atom that reads none. It ranks
        the kernels that wait for communication (`kernel_priority`)."""
        inputs, is_compute = self.inputs, self.is_compute
        ready = [max(inputs[a], default=a) if not is_compute[a] else 0 for a in range(len(inputs))]
        return [
            max((ready[s] + 1 for s in inputs[a] if not is_compute[s]), default=0)
            for a in range(len(inputs))
        ]

    def kernel_rank(self, atoms) -> int:
        """`late_read_rank` of a kernel: the largest of its atoms'."""
        rank = self.late_read_rank
        return max((rank[a] for a in atoms), default=0)

    @cached_property
    def name_position(self) -> dict[str, int]:
        """Each instruction's place in the module's topological order, by name."""
        return {name: self.position[id(instr)] for name, instr in self.by_name.items()}

    def bytes_of(self, instr: Instruction) -> int:
        """The instruction's result bytes, computed once."""
        found = self._bytes.get(id(instr))
        if found is None:
            found = self._bytes[id(instr)] = instr.shape.bytes
        return found

    def flops_of(self, instr: Instruction) -> int:
        """The instruction's FLOPs, computed once."""
        found = self._flops.get(id(instr))
        if found is None:
            found = self._flops[id(instr)] = instr.flops
        return found

    def through(self, atom: int) -> frozenset[int]:
        """The compute atoms an all-reduce atom's value waits for."""
        return self._through(atom, self.through_cache)

    def _through(self, atom: int, through: dict[int, frozenset[int]]) -> frozenset[int]:
        if atom in through:
            return through[atom]
        found: set[int] = set()
        stack = list(self.inputs[atom])
        seen = set()
        while stack:
            source = stack.pop()
            if source in seen:
                continue
            seen.add(source)
            if self.is_compute[source]:
                found.add(source)
            elif source in through:
                found |= through[source]
            else:
                stack.extend(self.inputs[source])
        through[atom] = frozenset(found)
        return through[atom]


def module_index(module: HloModule) -> ModuleIndex:
    """The module's index, built on first use and kept beside it
    (`HloModule.analyses`)."""
    return module.analyses.get(ModuleIndex, lambda: ModuleIndex(module))
