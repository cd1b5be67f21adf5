"""Quantization (ONNX side): rule table → first plan → apply with onnxruntime's tools → sensitivity loop."""
