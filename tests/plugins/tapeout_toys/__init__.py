"""A package of tapeout plug-ins, as a third party would write it: a target, a quantization method and a graph
pass, each one module, each registered by one line of entry_points.txt (tapeout_toys-0.1.dist-info). The tests
put this folder on PYTHONPATH; nothing of tapeout is edited to add them."""
