"""Numerical building blocks below the models: draft attention, rotary embeddings, CPU linear packing, and the
Python face of the C++/CUDA attention plugin (kernels/plugin)."""
