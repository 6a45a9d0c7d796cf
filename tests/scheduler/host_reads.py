"""A torch function mode that records the calls reading a tensor's values on the host (what a CUDA graph
capture forbids), so that CPU tests can check a forward's capture safety."""

from __future__ import annotations

from torch.overrides import TorchFunctionMode


class HostReads(TorchFunctionMode):
    """Records every torch call that reads a tensor's values on the host (what a CUDA graph capture refuses: on
    a GPU each is a synchronisation), by name."""

    NAMES = {"item", "tolist", "__bool__", "__int__", "__index__", "__float__", "nonzero", "argwhere", "unique",
             "masked_select", "equal", "cpu", "numpy"}

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.NAMES or (name == "where" and len(args) + len(kwargs or {}) == 1):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))
