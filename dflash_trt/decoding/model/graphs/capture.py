"""CUDA-graph capture shared by the graphed decoding steps (graphed_verifier.py, graphed_drafter.py)."""

from __future__ import annotations

from typing import Any, Callable

import torch


def capture_graph(run: Callable[[], Any], pool) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Warm `run` up on a side stream (kernel selection, workspaces), then capture it into a graph in `pool`.

    Returns (graph, the outputs of the captured run); a replay writes new outputs into the same tensors.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = run()
    return graph, outputs
