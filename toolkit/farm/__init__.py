"""The device farm (`tapeout farm`): many projects × profiles × devices on a Ray cluster, one verified table.

plan (the PLAN.toml file) → devices (what a node may advertise) → runtime (Ray, imported and started safely) →
tasks (what runs on a worker: a build, a check, each in a fresh `tapeout` process) → head (scheduling, faults,
progress) → results (build dirs received, verified and written; the summary, the table and the HTML).
"""
