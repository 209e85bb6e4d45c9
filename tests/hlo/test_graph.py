"""The graph view: links, order, sizes, FLOPs and the gradient all-reduces."""

from __future__ import annotations

import pytest

from disco_xla import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.shapes import Shape


def module_of(captured, name: str) -> HloModule:
    return HloModule.from_bytes(captured[name][0], name)


def test_operands_users_and_called_computations_are_linked_both_ways(captured):
    module = module_of(captured, "jax_pmap_step")
    for computation in module.computations:
        for instr in computation.instructions:
            for operand in instr.operands:
                assert operand.computation is computation
                assert instr in operand.users
            for called in instr.called_computations:
                assert instr in called.callers
    body = next(c for c in module.computations if "manual_computation_body" in c.name)
    (call,) = body.callers
    assert call.opcode == "call" and call.computation is module.entry
    assert body.role == "program"
    reducers = [c for c in module.computations if c.role == "applied"]
    assert reducers and all(c.root.opcode == "add" for c in reducers)


@pytest.mark.parametrize("name", ["jax_pmap_step", "jax_conv_dot_sort", "tf_train_step"])
def test_topological_order_puts_every_operand_before_its_users(captured, name):
    module = module_of(captured, name)
    for computation in module.computations:
        order = computation.topological_order
        assert sorted(i.name for i in order) == sorted(i.name for i in computation.instructions)
        position = {id(instr): index for index, instr in enumerate(order)}
        for instr in order:
            for dep in instr.operands + instr.control_predecessors:
                assert position[id(dep)] < position[id(instr)]


def test_pmap_step_has_one_gradient_all_reduce_per_parameter_tensor(captured):
    module = module_of(captured, "jax_pmap_step")
    gradients = module.gradient_all_reduces
    assert len(gradients) == 4  # hidden_w, hidden_b, output_w, output_b
    assert sorted(g.shape for g in gradients) == [
        "f32[10]",
        "f32[256,10]",
        "f32[256]",
        "f32[64,256]",
    ]
    assert {g.bytes for g in gradients} == {64 * 256 * 4, 256 * 4, 256 * 10 * 4, 10 * 4}
    assert all(g.group_size == 4 and g.scope == "global" for g in gradients)
    # The loss pmean is an all-reduce too, but not of a gradient.
    (loss,) = [a for a in module.all_reduces if not a.is_gradient]
    assert loss.shape == "f32[]"


def test_shard_map_counts_the_gradient_once_not_its_re_reduction(captured):
    module = module_of(captured, "jax_shard_map_step")
    assert len(module.all_reduces) >= 1
    assert len(module.gradient_all_reduces) == 1
    assert module.gradient_all_reduces[0].shape == "f32[8,4]"


def test_single_device_tf_step_has_no_all_reduces(captured):
    module = module_of(captured, "tf_train_step")
    assert module.all_reduces == []
    assert module.device_counts() == {"num_replicas": 1, "num_partitions": 1}


def test_pmap_step_runs_on_four_partitions(captured):
    assert module_of(captured, "jax_pmap_step").device_counts() == {
        "num_replicas": 1,
        "num_partitions": 4,
    }


def test_flops_of_convolution_and_dot_follow_their_formulas(captured):
    module = module_of(captured, "jax_conv_dot_sort")
    (conv,) = [i for i in module.instructions() if i.opcode == "convolution"]
    # out f32[2,5,8,8], kernel 3x3 over 3 input features
    assert conv.flops == 2 * (2 * 5 * 8 * 8) * (3 * 3) * 3
    (dot,) = [i for i in module.instructions() if i.opcode == "dot"]
    assert dot.flops == 2 * 2 * 7 * (5 * 8 * 8)
    assert module.total_flops >= conv.flops + dot.flops


def test_opcodes_the_view_does_not_model_are_kept(captured):
    module = module_of(captured, "jax_conv_dot_sort")
    (sort,) = [i for i in module.instructions() if i.opcode == "sort"]
    assert sort.flops == 0 and sort.called_computations
    sort.proto.opcode = "some-future-opcode"
    again = HloModule.from_bytes(module.to_bytes(), "again")
    assert again.opcode_histogram()["some-future-opcode"] == 1


def test_shapes_give_byte_sizes_of_arrays_and_tuples():
    f32 = Shape("f32", (8, 16), (), 32)
    bf16 = Shape("bf16", (3,), (), 16)
    s4 = Shape("s4", (3,), (), 4)
    assert (f32.bytes, bf16.bytes, s4.bytes) == (512, 6, 2)
    assert Shape("tuple", (), (f32, bf16)).bytes == 518
    assert str(Shape("tuple", (), (f32, bf16))) == "(f32[8,16], bf16[3])"


def test_a_cycle_is_refused_with_the_computation_named(captured):
    module = module_of(captured, "tf_train_step")
    computation = max(module.computations, key=lambda c: len(c.instructions))
    user = next(i for i in computation.instructions if i.operands)
    operand = user.operands[0]
    operand.proto.operand_ids.append(user.id)
    with pytest.raises(DiscoInputError, match="cycle"):
        _ = HloModule(module.proto, "cyclic.pb").computation(computation.name).topological_order


def test_dangling_operand_ids_are_refused(captured):
    module = module_of(captured, "tf_train_step")
    next(i for i in module.instructions() if i.operands).proto.operand_ids.append(123456789)
    with pytest.raises(DiscoInputError, match="unknown operand id 123456789"):
        HloModule(module.proto, "dangling.pb")


def test_while_and_conditional_bodies_are_program_code_counted_once():
    import jax
    import jax.numpy as jnp

    from disco_xla import capture_jax

    def f(x, flag):
        looped = jax.lax.fori_loop(0, 3, lambda i, v: jnp.tanh(v @ v), x)
        return jax.lax.cond(flag, lambda v: v * 2.0, lambda v: v - 1.0, looped)

    module = capture_jax(f, jnp.ones((4, 4)), True)
    (loop,) = [i for i in module.instructions() if i.opcode == "while"]
    (branch,) = [i for i in module.instructions() if i.opcode == "conditional"]
    assert len(loop.called_computations) == 2 and len(branch.called_computations) == 2
    for called in loop.called_computations + branch.called_computations:
        assert called.role == "program"
    # The loop body's dot is counted once (its trip count is not known statically).
    assert module.total_flops >= 2 * 4 * 4 * 4


def test_control_predecessors_are_linked_and_ordered():
    from disco_xla.hlo.hlo_io import module_from_text

    module = module_from_text(
        "HloModule m\n\nENTRY main {\n"
        "  p = f32[4] parameter(0)\n"
        "  late = f32[4] negate(p)\n"
        "  early = f32[4] exponential(p), control-predecessors={late}\n"
        "  ROOT t = (f32[4], f32[4]) tuple(late, early)\n}\n"
    )
    early, late = module.entry.by_name["early"], module.entry.by_name["late"]
    assert early.control_predecessors == [late]
    order = [i.name for i in module.entry.topological_order]
    assert order.index("late") < order.index("early")


def test_fingerprint_ignores_id_counters_and_source_lines_but_not_the_program():
    import jax
    import jax.numpy as jnp

    from disco_xla.capture import capture_jax

    def step(scale):
        return jax.jit(lambda x: jnp.tanh(x) * scale)

    x = jnp.ones((4, 4))
    first = capture_jax(step(2.0), x)
    capture_jax(jax.jit(lambda y: jnp.sin(y) @ y), x)  # moves XLA's id counters on
    again = capture_jax(step(2.0), x)  # and from another source line
    assert first.to_bytes() != again.to_bytes()
    assert first.fingerprint == again.fingerprint
    assert capture_jax(step(3.0), x).fingerprint != first.fingerprint


MARKED = """HloModule marked

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  x = f32[4] parameter(0)
  forward = f32[4] tanh(x), metadata={op_name="jit(step)/tanh"}
  backward = f32[4] negate(forward), metadata={op_name="jit(step)/transpose(jvp(tanh))/neg"}
  grad = f32[4] all-reduce(backward), replica_groups={{0,1}}, to_apply=sum
  loss = f32[4] all-reduce(forward), replica_groups={{0,1}}, to_apply=sum
  ROOT t = (f32[4], f32[4]) tuple(grad, loss)
}
"""


def test_only_sums_of_backward_code_are_gradients_where_the_module_is_marked():
    from disco_xla.hlo.hlo_io import module_from_text

    module = module_from_text(MARKED, "marked")
    assert [a.name for a in module.gradient_all_reduces] == ["grad"]
    unmarked = module_from_text(MARKED.replace("transpose(jvp(tanh))", "tanh"), "unmarked")
    assert sorted(a.name for a in unmarked.gradient_all_reduces) == ["grad", "loss"]


def test_instructions_are_found_by_name_and_removed_until_the_view_is_rebuilt():
    from disco_xla.hlo.hlo_io import module_from_text

    module = module_from_text(MARKED, "marked")
    loss = module.instruction("loss")
    assert loss.opcode == "all-reduce" and loss.computation is module.entry
    with pytest.raises(KeyError):
        module.instruction("nothing")
    root = module.entry.root
    root.proto.operand_ids[1] = module.instruction("forward").id
    assert module.remove_instructions([loss]) == 1
    assert module.instruction("loss") is loss  # the view is as it was
    module.rebuild()
    with pytest.raises(KeyError):
        module.instruction("loss")
    assert [a.name for a in module.all_reduces] == ["grad"]
    assert module.remove_instructions([]) == 0
