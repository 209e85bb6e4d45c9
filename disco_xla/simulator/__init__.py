"""Cost models and the event simulator of compute and communication streams:
roofline, table and GNN kernel costs (`cost_models`, `gnn`), the collective
model (`comm`), and the event simulator of a plan's step (`events`, with its
incremental form for the search, `incremental`)."""
