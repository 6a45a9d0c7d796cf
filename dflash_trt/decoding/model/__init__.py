"""What a decoding step runs: the target (target.py), the drafter families (drafters/), the KV caches, their
CUDA-graph twins (graphs/) and drafters run as exported graphs (exported/). protocols.py states the contracts
the step and scheduler rely on."""
