"""The built-in workloads, one module each behind core/workload.py's contract: `forward` (one call), `generate`
(prefill and decode over a KV cache), `stream` (chunks with carried state)."""
