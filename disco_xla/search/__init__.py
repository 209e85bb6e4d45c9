"""Search over op-fusion groups and all-reduce buckets, and the baselines.

`baselines` builds every baseline of the design notes as a plan. The backtracking
search itself is the next step (issue: Backtracking search).
"""
