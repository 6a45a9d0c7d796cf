"""The postprocessing model: chunk text, statistics passed through, cancellation marked."""

from __future__ import annotations

import numpy as np

from dflash_trt.serving.cancellation import CancelBoard
from dflash_trt.serving.postprocess import postprocess, respond
from dflash_trt.serving.requests import OUTPUTS


def chunk(ids, num_context, finish=b"", generation_id=b"0" * 32):
    return {
        "output_ids": np.array(ids, dtype=np.int32), "num_context_tokens": np.array([num_context], dtype=np.int32),
        "num_output_tokens": np.array([7], dtype=np.int32), "total_draft_tokens": np.array([21], dtype=np.int32),
        "total_accepted_draft_tokens": np.array([6], dtype=np.int32),
        "acceptance_rate": np.array([6 / 21], dtype=np.float32), "finish_reason": np.array([finish], dtype=object),
        "num_cached_tokens": np.array([32], dtype=np.int32), "num_verify_steps": np.array([4], dtype=np.int32),
        "generation_id": np.array([generation_id], dtype=object),
    }


def test_returns_the_text_of_the_new_tokens_and_the_statistics(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("Hello big world", add_special_tokens=False)
    out = postprocess(smollm2_tokenizer, chunk(ids, 1))
    assert set(out) == set(OUTPUTS)
    assert out["text_output"][0].decode() == smollm2_tokenizer.decode(ids)[len("Hello"):]
    assert out["total_draft_tokens"][0] == 21 and out["finish_reason"][0] == b""
    assert out["num_cached_tokens"].tolist() == [[32]]  # passed through with TensorRT-LLM's [1, 1] shape
    assert out["num_verify_steps"].tolist() == [[4]]


def test_holds_back_a_split_character_until_the_last_chunk(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("ok 🎉", add_special_tokens=False)
    partial = chunk(ids[:-1], 0)
    assert postprocess(smollm2_tokenizer, partial)["text_output"][0].decode() == "ok "
    assert postprocess(smollm2_tokenizer, chunk(ids, len(ids) - 1, b"length"))["text_output"][0].decode() == "🎉"


def test_a_cancelled_request_marks_its_generation_and_is_answered_without_an_error(fake_pb, smollm2_tokenizer,
                                                                                     tmp_path):
    """No error: Triton 2.51 would keep the ensemble request in flight (test_faults_shutdown shows it end to end)."""
    board = CancelBoard(tmp_path)
    generation_id = CancelBoard.new_id()
    request = fake_pb.Request(chunk([1, 2], 0, generation_id=generation_id.encode()), cancelled=True)
    response = respond(fake_pb, request, smollm2_tokenizer, board)
    assert response.error is None and response.outputs["num_output_tokens"].shape == (1, 1)
    assert board.is_marked(generation_id)


def test_a_broken_chunk_gets_an_error_response(fake_pb, smollm2_tokenizer, tmp_path):
    request = fake_pb.Request(chunk([1, 2], 5))
    response = respond(fake_pb, request, smollm2_tokenizer, CancelBoard(tmp_path))
    assert "num_context_tokens=5" in response.error.message()
