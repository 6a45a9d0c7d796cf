"""The decoding engine: DFlash drafting, verification and in-flight batching, with no serving code.

Layers, each importing only the ones below it (tests/test_layers.py keeps it so):
    api.py, reference.py   generate / stream_generate / decode; the reference project's HF-style API
    scheduler/             who runs next: admission, chunked prefill, the block-size policy
    step/                  one decoding step: draft -> verify -> accept -> commit; requests and sampling
    step/verify/           verification methods behind one protocol (the chain today)
    model/                 what runs: the target, drafter families, KV caches, CUDA graphs, exported drafters
    kernels/               attention, rotary embeddings, CPU linear packing, the plugin's op faces
"""
