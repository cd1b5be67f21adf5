# Put first on PYTHONPATH by tapeout's farm (toolkit/farm/runtime.py) only where the installed amdsmi cannot load
# ROCm's libamd_smi: that amdsmi raises KeyError on import, which Ray (it probes for AMD GPUs when it imports)
# does not survive; an ImportError it does. tapeout's own amdsmi meter reads this as "amdsmi: cannot import".
raise ImportError("amdsmi cannot load ROCm's libamd_smi on this host (hidden by tapeout's farm so that Ray starts)")
