"""Cancellation of ensemble requests, which Triton 2.51 does not pass on to the running dflash step.

What Triton 2.51 does (observed): when a client cancels a gRPC stream or closes an HTTP
generate_stream connection, the ensemble request is cancelled, but the step already running
(dflash) never sees it: its `is_cancelled()` stays False and it would generate to max_tokens.
The ensemble does mark the *next* step requests it creates as cancelled, so the postprocessing
model sees `request.is_cancelled()` on the following chunk. It then marks the generation on this
board, and the dflash model, which checks the board between decoding steps, stops.

The board is a directory of empty files named by generation id, shared by the model processes of
one server (their parent process); a file costs one stat per decoding step to check.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path

PRUNE_EVERY_S = 300.0
STALE_AFTER_S = 600.0
# Names a StepGate directory; set only by tests that count decoding steps (see StepGate).
STEP_GATE_ENV = "DFLASH_TRT_STEP_GATE"
GATE_POLL_S = 0.005


class CancelBoard:
    """Generation ids that a client cancelled, visible to every model process of the server."""

    def __init__(self, directory: str | Path | None = None):
        # The Python backend's stubs are children of tritonserver: its pid names the board.
        default = Path(tempfile.gettempdir()) / f"dflash-cancelled-{os.getppid()}"
        self.directory = Path(directory) if directory else default
        self.directory.mkdir(parents=True, exist_ok=True)
        self._last_prune = 0.0

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def mark(self, generation_id: str) -> None:
        if _is_id(generation_id):
            (self.directory / generation_id).touch()

    def is_marked(self, generation_id: str) -> bool:
        return (self.directory / generation_id).exists()

    def clear(self, generation_id: str) -> None:
        (self.directory / generation_id).unlink(missing_ok=True)
        now = time.time()
        if now - self._last_prune > PRUNE_EVERY_S:
            self._last_prune = now
            self.prune(now - STALE_AFTER_S)

    def prune(self, older_than: float) -> None:
        """Drop marks left behind (a cancellation noticed after its generation ended)."""
        for path in self.directory.iterdir():
            try:
                if path.stat().st_mtime < older_than:
                    path.unlink()
            except FileNotFoundError:
                pass

    def remove_if_empty(self) -> None:
        """At unload: the last model process of the server takes the empty board away."""
        try:
            self.directory.rmdir()
        except OSError:
            pass


def _is_id(value: str) -> bool:
    # Only our own hex ids name files: a malformed tensor must not write elsewhere.
    return len(value) == 32 and all(c in "0123456789abcdef" for c in value)


class StepGate:
    """Paces decoding steps by files, so that a test can count the steps a cancellation lets through.

    Only active when the server's environment names a directory in DFLASH_TRT_STEP_GATE. While
    `<directory>/hold` exists, every step after the first waits for a `permit-*` file and consumes
    it (the first process to delete it wins). A cancellation seen while waiting ends the wait: the
    step it would have allowed is not computed.
    """

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    @classmethod
    def from_env(cls) -> "StepGate | None":
        directory = os.environ.get(STEP_GATE_ENV, "")
        return cls(directory) if directory else None

    def paced(self, is_cancelled):
        """is_cancelled, checked between two steps, made to wait for a permit while the gate holds."""

        def wait_then_check() -> bool:
            while (self.directory / "hold").exists() and not is_cancelled():
                if self._take_permit():
                    break
                time.sleep(GATE_POLL_S)
            return is_cancelled()

        return wait_then_check

    def _take_permit(self) -> bool:
        for permit in sorted(self.directory.glob("permit-*")):
            try:
                permit.unlink()
                return True
            except FileNotFoundError:  # another process took it
                continue
        return False
