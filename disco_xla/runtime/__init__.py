"""Execution of (rewritten) modules under JAX and TensorFlow."""
