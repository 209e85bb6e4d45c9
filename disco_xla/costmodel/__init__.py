"""The learned (GNN) kernel cost model, in one place: a fused kernel's instruction
graph (`features`), the graph network that predicts the kernel's log-time and its
`GnnCostModel` (`network`), its weights on disk and the shipped ones (`weights`),
the data set of measured kernels it learns from (`dataset`), and its training and
evaluation against the roofline (`training`).

It reads the IR and the simulator's `Kernel`, and its `GnnCostModel` implements
the simulator's `CostModel` protocol. The simulator reaches it by name only
(`cost_models.make_cost_model("gnn", ...)` imports it when asked for it), so
jraph and haiku are not loaded unless the GNN is used.
"""
