"""Backtracking search over op-fusion groups and all-reduce buckets, and baselines.

Planned (issue: Backtracking search). Nothing is public yet.
"""
