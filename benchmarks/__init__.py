"""Measurements that need real hardware; see benchmarks/results/README.md."""
