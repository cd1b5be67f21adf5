"""Measurement on this machine: fresh inference processes (`runner`) timed with their meters (RSS, RAPL,
NVML, amdsmi, tegrastats), the statistics that bound a percentile, and the verdicts that judge budgets
on those bounds.
"""
