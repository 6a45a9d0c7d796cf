"""The served demo: render an engine's repository, start Triton, stream one answer, print tau, stop."""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dflash_trt.serving.client import GrpcStream
from dflash_trt.serving.repo import RepoConfig, render_repository
from dflash_trt.serving.server import serve_on_free_ports


@dataclass
class DemoAnswer:
    text: str
    num_output_tokens: int
    num_chunks: int
    tau: float  # mean tokens committed per verify step (accepted drafts + 1)
    finish_reason: str


def tau_from_totals(total_draft_tokens: int, total_accepted_draft_tokens: int, block_size: int,
                    num_verify_steps: int = 0) -> float:
    """Mean acceptance length from the response statistics: over the verify steps the server counted, else taking
    every verify step to draft block_size - 1."""
    if block_size < 2 or total_draft_tokens == 0:
        return 1.0
    steps = num_verify_steps or total_draft_tokens / (block_size - 1)
    return 1.0 + total_accepted_draft_tokens / steps


def served_answer(engine_dir: Path, repo_dir: Path, prompt: str, max_tokens: int, chat_template: str = "model",
                  write: Callable[[str], None] = print, ready_timeout_s: float = 600.0) -> DemoAnswer:
    """Serve `engine_dir` on free loopback ports, stream one answer over gRPC (echoed as it arrives)."""
    from dflash_trt.engine import load_engine

    block_size = load_engine(engine_dir, verify=False, load_models=False).block_size
    render_repository(RepoConfig(engine_dir, repo_dir, chat_template=chat_template))
    log = Path(tempfile.mkstemp(prefix="dflash-triton-", suffix=".log")[1])
    write(f"starting Triton on {repo_dir} (log: {log}) ...")
    with serve_on_free_ports(repo_dir, ready_timeout_s=ready_timeout_s, log_path=log) as server:
        write(server.describe())
        write(f"\n> {prompt}\n")
        stream = GrpcStream(server.config.grpc_url)
        pieces, last = [], {}
        try:
            for chunk in stream.chunks(prompt, max_tokens):
                pieces.append(chunk["text_output"])
                sys.stdout.write(chunk["text_output"])
                sys.stdout.flush()
                last = chunk
        finally:
            stream.close()
        write("\nstopping Triton ...")
    tau = tau_from_totals(last.get("total_draft_tokens", 0), last.get("total_accepted_draft_tokens", 0), block_size,
                          last.get("num_verify_steps", 0))
    answer = DemoAnswer("".join(pieces), last.get("num_output_tokens", 0), len(pieces), tau,
                        last.get("finish_reason", ""))
    write(f"[served: {answer.num_output_tokens} tokens in {answer.num_chunks} streamed chunks "
          f"({answer.finish_reason}); tau {answer.tau:.2f} = mean tokens per verify step (plain decoding: 1.00, "
          f"at most the block size {block_size})]")
    return answer


@dataclass
class PlainComparison:
    """The same prompt generated in process with DFlash and with plain decoding, on the same engine."""

    dflash_tokens_per_s: float
    plain_tokens_per_s: float
    num_output_tokens: int
    tau: float
    identical: bool
    weight_bytes_per_step: int = 0  # what one target forward reads (gguf_weights.weight_bytes_per_step)
    draft_bytes_per_step: int = 0  # what one draft reads: the drafter's weights and the target's head again
    drafted_share: float = 1.0  # of DFlash's verify steps, those that drafted (the policy decodes plain in the others)

    @property
    def speedup(self) -> float:
        return self.dflash_tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s else 0.0

    def describe(self) -> str:
        same = "the same tokens" if self.identical else "DIFFERENT tokens (a bug: DFlash is lossless)"
        line = (f"[in process, same prompt: DFlash (adaptive block size, as served) {self.dflash_tokens_per_s:.1f} "
                f"tokens/s against plain decoding "
                f"{self.plain_tokens_per_s:.1f} tokens/s ({self.speedup:.2f}x), tau {self.tau:.2f}, "
                f"{self.num_output_tokens} tokens, {same}]")
        if not self.weight_bytes_per_step:
            return line
        # One target forward per step reads every weight once; DFlash spreads a step over tau tokens.
        mb, draft_mb = self.weight_bytes_per_step / 1e6, self.draft_bytes_per_step / 1e6
        per_token = (mb + self.drafted_share * draft_mb) / max(self.tau, 1e-9)
        return (line + f"\n[weights read: plain decoding {mb:.1f} MB/token = {mb * self.plain_tokens_per_s / 1e3:.2f} "
                f"GB/s; DFlash {mb:.1f} MB per verify + {draft_mb:.1f} MB per draft (in {self.drafted_share:.0%} of "
                f"the verify steps) over tau tokens = "
                f"{per_token:.1f} MB/token = {per_token * self.dflash_tokens_per_s / 1e3:.2f} GB/s]")


def compare_with_plain(engine_dir: Path, prompt: str, max_tokens: int) -> PlainComparison:
    """Generate `prompt` (through the chat template) greedily with DFlash as the server runs it (the adaptive
    block-size policy over the engine's block sizes, which decodes plain where drafting does not pay) and with plain
    decoding (block size 1), timed from the first token on (prefill excluded, as in `bench`)."""
    from dflash_trt.decoding.api import generate
    from dflash_trt.decoding.model.tokens import default_stop_ids, encode_prompt
    from dflash_trt.decoding.scheduler.block_policy import make_policy
    from dflash_trt.decoding.scheduler.scheduler import allowed_block_sizes
    from dflash_trt.decoding.step.sampling import SamplingParams
    from dflash_trt.engine import load_engine

    engine = load_engine(engine_dir)
    target, drafter = engine.target, engine.drafter
    prompt_ids = encode_prompt(target, prompt, chat=bool(getattr(target.tokenizer, "chat_template", None)))
    params = SamplingParams(max_new_tokens=max_tokens, stop_token_ids=tuple(default_stop_ids(target)))
    generate(target, drafter, [prompt_ids], SamplingParams(max_new_tokens=4), block_size=engine.block_size)  # warm
    served_policy = make_policy("adaptive", engine.block_size, allowed_block_sizes(drafter, engine.block_size))
    runs = {}
    for name, block, policy in (("plain", 1, None), ("dflash", engine.block_size, served_policy)):
        start = time.perf_counter()
        result = generate(target, drafter, [prompt_ids], params, block_size=block, policy=policy)[0]
        runs[name] = (result, time.perf_counter() - start - result.prefill_s)
    (plain, plain_s), (spec, spec_s) = runs["plain"], runs["dflash"]
    drafted = [d > 0 for d in spec.draft_lengths] or [True]  # (no draft lengths: every step drafted)
    return PlainComparison(spec.num_output_tokens / max(spec_s, 1e-9), plain.num_output_tokens / max(plain_s, 1e-9),
                           spec.num_output_tokens, spec.tau, spec.token_ids == plain.token_ids,
                           *_bytes_per_step(target, drafter), drafted_share=sum(drafted) / len(drafted))


def _bytes_per_step(target, drafter) -> tuple[int, int]:
    """(bytes of weights a target forward reads, bytes a draft reads): 0s where the models are not torch modules."""
    from torch import nn

    from dflash_trt.decoding.model.gguf_weights import weight_bytes_per_step

    model = getattr(target, "model", None)
    if not isinstance(model, nn.Module):
        return 0, 0
    head = weight_bytes_per_step(model.get_output_embeddings())
    # The drafter's linear layers (float, or Q8_0 blocks beside a GGUF-precision target: buffers, not parameters).
    drafted = weight_bytes_per_step(drafter) if isinstance(drafter, nn.Module) else 0
    return weight_bytes_per_step(model), drafted + head
