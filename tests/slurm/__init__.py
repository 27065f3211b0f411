"""Helpers of tests/test_slurm.py: a real single-node SLURM (cluster.py) and the test's
layer over workflow/profiles/slurm (profiles.py)."""
