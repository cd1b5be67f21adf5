"""Reading an ONNX model at the build's shapes: the graph view (producers, consumers, shapes, control-flow
bodies), per-node costs and activation liveness (`analyze`), and architecture detection (`detect`:
families, node roles, fusion groups). The result is an `Analysis` (`analysis`), which the quantization
rules, the estimator and the reports read.
"""
