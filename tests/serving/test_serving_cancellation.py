"""The cancel board shared by the postprocessing and dflash model processes."""

from __future__ import annotations

import os
import time

from dflash_trt.serving.cancellation import CancelBoard


def test_a_marked_generation_is_seen_by_another_board_on_the_same_directory(tmp_path):
    generation_id = CancelBoard.new_id()
    CancelBoard(tmp_path).mark(generation_id)
    other = CancelBoard(tmp_path)
    assert other.is_marked(generation_id)
    other.clear(generation_id)
    assert not other.is_marked(generation_id)


def test_ignores_anything_but_its_own_ids(tmp_path):
    board = CancelBoard(tmp_path / "board")
    board.mark("../../etc/passwd")
    board.mark("")
    assert list(board.directory.iterdir()) == []


def test_prunes_stale_marks(tmp_path):
    board = CancelBoard(tmp_path)
    old, new = CancelBoard.new_id(), CancelBoard.new_id()
    board.mark(old)
    board.mark(new)
    past = time.time() - 3600
    os.utime(tmp_path / old, (past, past))
    board.prune(time.time() - 600)
    assert not board.is_marked(old) and board.is_marked(new)


def test_an_empty_board_is_removed_at_unload_but_not_a_used_one(tmp_path):
    board = CancelBoard(tmp_path / "board")
    board.mark(CancelBoard.new_id())
    board.remove_if_empty()
    assert board.directory.is_dir()
    for path in board.directory.iterdir():
        path.unlink()
    board.remove_if_empty()
    assert not board.directory.exists()
