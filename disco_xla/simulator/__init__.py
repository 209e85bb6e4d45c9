"""Cost models and the event simulator of compute and communication streams.

Planned (issue: Simulator): roofline / table / GNN kernel costs, the ring and
hierarchical all-reduce model, and the event simulator. Nothing is public yet.
"""
