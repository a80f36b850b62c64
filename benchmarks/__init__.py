"""Benchmarks of rheo_flow: ``python benchmarks/run.py SUITE [--quick] [--json]``."""
