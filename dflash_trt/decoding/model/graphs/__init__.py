"""CUDA-graph twins of the target's verify forward and the drafter's forward, on static caches."""
