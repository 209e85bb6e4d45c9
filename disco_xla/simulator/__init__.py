"""Cost models and the event simulator of compute and communication streams:
roofline and table kernel costs, and the GNN's by name (`cost_models`; the GNN
itself is in `disco_xla.costmodel`), the collective model (`comm`), and the event
simulator of a plan's step (`events`, with its incremental form for the search,
`incremental`)."""
