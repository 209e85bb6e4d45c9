"""Measuring on this machine: the collectives a cluster profile is calibrated
from (`calibrate`), per-instruction kernel times for the table cost model and
the GNN's training data (its data set and training are `disco_xla.costmodel`),
sampled plans, and the machine's speed reference."""
