"""The core everything else stands on: errors and their exit codes, the schemas of the files a user writes
(project, profile, device spec) and their loading, paths kept inside their folder, files written
atomically, the console, hashing and the host's fingerprint, input feeds, output parity, the project's
inputs and metric, walking ONNX graphs, and the vocabularies (precisions, rungs, meters, rule sets). It
imports nothing above it and nothing heavy at import time.
"""
