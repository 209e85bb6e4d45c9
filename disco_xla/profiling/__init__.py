"""Measuring kernels: per-instruction times from the JAX profiler, for the table
cost model and, later, the GNN's training data."""
