"""Sets of HLO opcodes that the graph view and its analyses sort
instructions by."""

# Instructions whose called computations run as program code (not as reducers).
CONTROL_FLOW_OPCODES = frozenset(
    {"call", "while", "conditional", "async-start", "async-update", "async-done", "custom-call"}
)
ALL_REDUCE_OPCODES = frozenset({"all-reduce", "all-reduce-start"})
COLLECTIVE_OPCODES = ALL_REDUCE_OPCODES | frozenset(
    """all-gather all-gather-start reduce-scatter all-to-all collective-permute
    collective-permute-start collective-broadcast ragged-all-to-all""".split()
)
# Cross-device reductions a plan can bucket: the all-reduce, and its sharded form,
# the reduce-scatter (what a ZeRO or FSDP step sends its gradients with).
REDUCTION_OPCODES = ALL_REDUCE_OPCODES | frozenset({"reduce-scatter"})
# The second half of an asynchronous collective: it waits for its start and hands
# on the result, and costs nothing of its own (the start carries the transfer).
COLLECTIVE_DONE_OPCODES = frozenset(
    {"all-reduce-done", "all-gather-done", "collective-permute-done"}
)
# Operations that compute each element of their result from the same element of
# each operand (all of one shape; a select's predicate too).
ELEMENTWISE_OPCODES = frozenset(
    """abs add and atan2 cbrt ceil compare convert cosine divide erf exponential
    exponential-minus-one floor is-finite log log-plus-one logistic maximum minimum
    multiply negate not or power remainder round-nearest-afz round-nearest-even
    rsqrt select sign sine sqrt subtract tan tanh xor""".split()
)
