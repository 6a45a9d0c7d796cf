"""End to end with a DFlash2 drafter: a torch engine served through the real tritonserver answers
greedy requests with exactly the target's own plain greedy decoding (tiny pairs, SmolLM2 tokenizer).

Two pairs: a random one (its drafts are practically never accepted, the tokens vary) and a predictable
one, built so that every other draft is accepted (the accept-then-reject path of every step)."""

from __future__ import annotations

import json
import queue
import shutil

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from transformers import AutoModelForCausalLM

from dflash_trt.serving.client import GrpcStream, generate, join_text
from dflash_trt.serving.detokenize import decode

pytestmark = pytest.mark.slow

PROMPTS = ["Write a short poem about the sea.", "Explain speculative decoding in one sentence:"]
MAX_TOKENS = 40
BLOCK_SIZE = 8
# The predictable pair: residual channel 0 carries +-OFFSET by the parity of the token (no layer writes to
# it), and the head reads it: the target alternates ODD_NEXT, EVEN_NEXT. The drafter sees the mask token
# (odd) in every slot, so it always drafts EVEN_NEXT: right at the first slot after ODD_NEXT, wrong after.
EVEN_NEXT, ODD_NEXT, OFFSET, HEAD = 1001, 1000, 100.0, 50.0


def make_predictable(target, drafter) -> None:
    with torch.no_grad():
        embeddings = target.get_input_embeddings().weight
        embeddings[0::2, 0], embeddings[1::2, 0] = OFFSET, -OFFSET
        for layer in [*target.model.layers, *drafter.layers]:
            layer.self_attn.o_proj.weight[0] = 0
            layer.mlp.down_proj.weight[0] = 0
        head = target.get_output_embeddings().weight
        head[EVEN_NEXT, 0], head[ODD_NEXT, 0] = HEAD, -HEAD


@pytest.fixture(scope="module", params=["random", "predictable"])
def dflash2_engine(request, tmp_path_factory, smollm2_tokenizer_dir):
    from dflash_trt.decoding.model.drafters import save_drafter
    from dflash_trt.engine.build import BuildRequest, build_engine
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("dflash2-pair")
    target = make_tiny_target("llama", vocab_size=49152, seed=5)
    drafter = make_tiny_drafter(target.config, block_size=BLOCK_SIZE, family="dflash2", seed=6)
    if request.param == "predictable":
        make_predictable(target, drafter)
    target.save_pretrained(str(root / "target"))
    save_drafter(drafter, root / "drafter")
    for item in smollm2_tokenizer_dir.iterdir():
        shutil.copy(item, root / "target" / item.name)
    build_engine(BuildRequest(model="smollm2-135m", target=root / "target", drafter=root / "drafter",
                              out=root / request.param), log=lambda _line: None)
    return root / request.param  # the engine directory is named after the pair


@pytest.fixture(scope="module")
def dflash2_triton(dflash2_engine, tmp_path_factory):
    from dflash_trt.serving.repo import RepoConfig, render_repository
    from dflash_trt.serving.server import serve_on_free_ports

    repo = render_repository(RepoConfig(dflash2_engine, tmp_path_factory.mktemp("dflash2-repo"), max_tokens_limit=64,
                                        max_context_tokens=512, num_threads=1, block_policy="fixed"))
    log = tmp_path_factory.mktemp("dflash2-triton") / "server.log"
    with serve_on_free_ports(repo, ready_timeout_s=600, log_path=log) as server:
        yield server


def plain_greedy(target_dir, prompt_ids: list[int], num_tokens: int) -> list[int]:
    """The target alone, one argmax token per forward over the whole sequence (no cache, no drafter)."""
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    ids = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(num_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


def served_token_ids(triton, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """The dflash model's own answer (token ids, no detokenization), greedy, end-of-sequence disabled."""
    values = {"input_ids": np.array(prompt_ids, np.int32), "max_tokens": np.array([max_tokens], np.int32),
              "end_id": np.array([-1], np.int32), "exclude_input_in_output": np.array([True])}
    inputs = []
    for name, array in values.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "BOOL" if array.dtype == bool else "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(triton.config.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("dflash", inputs)  # without stream: one response, the whole answer
        result, error = responses.get(timeout=300)
    finally:
        client.stop_stream()
        client.close()
    assert error is None, error
    assert int(result.as_numpy("num_context_tokens")[0]) == 0
    return result.as_numpy("output_ids").tolist()


def test_the_engine_serves_a_dflash2_drafter(dflash2_engine):
    manifest = json.loads((dflash2_engine / "manifest.json").read_text())
    assert manifest["drafter_family"] == "dflash2" and manifest["runtime"] == "torch"


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_answers_equal_the_targets_plain_decoding(dflash2_triton, dflash2_engine, smollm2_tokenizer, prompt):
    prompt_ids = smollm2_tokenizer.encode(prompt)
    expected = plain_greedy(dflash2_engine / "target", prompt_ids, MAX_TOKENS)
    assert served_token_ids(dflash2_triton, prompt_ids, MAX_TOKENS) == expected  # token-exact
    # Through the ensemble (tokenize, decode); end_id -1: no end-of-sequence, all MAX_TOKENS tokens compared.
    served = generate(dflash2_triton.config.http_url, prompt, MAX_TOKENS, exclude_input_in_output=True, end_id=-1)
    assert served["num_output_tokens"] == MAX_TOKENS and served["finish_reason"] == "length"
    assert served["text_output"] == decode(smollm2_tokenizer, expected)
    drafts, accepted = served["total_draft_tokens"], served["total_accepted_draft_tokens"]
    assert drafts >= MAX_TOKENS - 1  # the drafter ran: every verify step checked a (possibly shortened) block
    if dflash2_engine.name == "predictable":
        assert expected[:4] in ([ODD_NEXT, EVEN_NEXT] * 2, [EVEN_NEXT, ODD_NEXT] * 2)
        assert MAX_TOKENS // 2 - 2 <= accepted < drafts  # one accepted draft per step of two tokens

    stream = GrpcStream(dflash2_triton.config.grpc_url)
    try:
        chunks = list(stream.chunks(prompt, MAX_TOKENS, exclude_input_in_output=True, end_id=-1))
    finally:
        stream.close()
    assert join_text(chunks) == served["text_output"]
