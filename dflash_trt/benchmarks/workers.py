"""Client threads for the serving benchmarks: each worker holds one stream (a gRPC stream of
dflash_trt.serving.client, or anything with `chunks` and `close`), opened when first needed and opened anew after
a failure (a failed stream may still deliver the old request's responses)."""

from __future__ import annotations

import threading
from typing import Callable


class StreamSlot:
    """A worker's stream: `get` opens it when there is none, `reset` drops it after a failure, `close` at the end."""

    def __init__(self, open_stream: Callable[[], object]):
        self._open, self._stream = open_stream, None

    def get(self):
        if self._stream is None:
            self._stream = self._open()
        return self._stream

    def reset(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - closing a broken stream must not stop the run
                pass

    close = reset


def run_workers(concurrency: int, work: Callable[[StreamSlot], None], open_stream: Callable[[], object],
                name: str) -> None:
    """Run `work(slot)` in `concurrency` threads, each with its own StreamSlot (closed when its work returns), and
    wait for all of them."""

    def worker() -> None:
        slot = StreamSlot(open_stream)
        try:
            work(slot)
        finally:
            slot.close()

    threads = [threading.Thread(target=worker, name=f"{name}-{i}", daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
