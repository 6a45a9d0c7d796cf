"""CUDA-graph capture shared by the graphed decoding steps (verifier.py, drafter.py): one policy, one pool each."""

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


class GraphPool:
    """The capture policy of a graphed model: a static step's first run is eager (shapes seen once never pay a
    capture), its second is captured into this pool, and every later one replays the graph.

    A step is any object with `graph`, `outputs` and `calls` attributes (StaticForward, DraftStep).
    """

    def __init__(self):
        self._pool = None

    def run(self, step, run: Callable[[], Any], use_graphs: bool) -> Any:
        """The outputs of `run` for `step`: run eagerly (without graphs, or the first time), else replayed."""
        if not use_graphs or (step.graph is None and step.calls == 0):
            step.calls += 1
            return run()
        if step.graph is None:
            # Warm-up and capture both run on the step's real inputs: they write the same values at the same
            # places as the replay that follows.
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            step.graph, step.outputs = capture_graph(run, self._pool)
        step.graph.replay()
        return step.outputs
