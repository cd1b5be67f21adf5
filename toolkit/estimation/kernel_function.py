"""What an elementwise, movement, quantize or recurrent kernel computes, where its FLOPs and bytes do not tell it:
`function` in its shape (cost_units.Kernel.shape), a feature of those classes' predictors (predictor.py)."""

from __future__ import annotations

# A Relu and a Tanh read and write the same bytes at a FLOP an element, and at 1 MB the 1-thread sweep here ran Add and Relu at ~105 GB/s, Tanh and Sigmoid at 35-39, Erf at 26
# (held out, the elementwise predictor came within ±15 % on 81 % of its points knowing this, 41 % not). A kernel
# takes its costliest node's. Elementwise: 1 arithmetic, 2 the exponential's kin, 3 erf's and the trigonometric.
# Movement: 1 a copy of contiguous runs, 2 a gather of rows, 3 a transpose (a layout reorder is one). Quantize: 1
# into 8 bits, 2 out of them (DequantizeLinear ran at ~59 GB/s of its bytes where QuantizeLinear ran at ~91).
# Recurrent: the cell, 1 an LSTM's, 2 a GRU's, 3 a plain RNN's (held out, 87 % of the recurrent points within ±15 %
# knowing it, 81 % not).
FUNCTION_CLASSES = ("elementwise", "movement", "quantize", "recurrent")
_FUNCTION = {
    "elementwise": {**dict.fromkeys(("Exp", "Sigmoid", "Tanh", "Softplus", "Elu", "Selu", "Celu", "Mish", "QuickGelu",
                                     "FastGelu", "Swish"), 2),
                    **dict.fromkeys(("Erf", "Gelu", "BiasGelu", "Log", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan",
                                     "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"), 3)},
    "movement": {**dict.fromkeys(("Gather", "GatherElements", "GatherND"), 2),
                 **dict.fromkeys(("Transpose", "DepthToSpace", "SpaceToDepth", "ShuffleChannels", "ReorderInput",
                                  "ReorderOutput", "Reorder"), 3)},
    "quantize": {"DequantizeLinear": 2},
    "recurrent": {**dict.fromkeys(("GRU", "GRUSequence"), 2), **dict.fromkeys(("RNN", "RNNSequence"), 3)},
}


def function_shape(cls: str, op_types) -> tuple[tuple[str, int], ...]:
    """The `function` a kernel of `cls` made of nodes of `op_types` has in its shape (() outside FUNCTION_CLASSES)."""
    if cls not in FUNCTION_CLASSES:
        return ()
    return (("function", max((_FUNCTION[cls].get(op, 1) for op in op_types), default=1)),)
