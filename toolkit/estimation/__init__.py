"""Estimation for a device that is not here: the device's roofs (`roofline`), the model as the kernels a
runtime launches (`cost_units`), the fit of a runtime's efficiency per kernel class from measured builds
(`fit`, `tapeout calibrate`), the estimate with its error band (`estimate`) and the per-op bottleneck view
of a measured run (`bottleneck`).
"""
