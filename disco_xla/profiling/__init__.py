"""Measuring on this machine: the collectives a cluster profile is calibrated
from (`calibrate`), per-instruction kernel times for the table cost model and
the GNN's training data, sampled plans, and the cost model's data set and
training."""
