"""The served demo: render an engine's repository, start Triton, stream one answer, print tau, stop."""

from __future__ import annotations

import sys
import tempfile
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


def tau_from_totals(total_draft_tokens: int, total_accepted_draft_tokens: int, block_size: int) -> float:
    """Mean acceptance length from the response statistics: every verify step drafts block_size - 1."""
    if block_size < 2 or total_draft_tokens == 0:
        return 1.0
    steps = total_draft_tokens / (block_size - 1)
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
    tau = tau_from_totals(last.get("total_draft_tokens", 0), last.get("total_accepted_draft_tokens", 0), block_size)
    answer = DemoAnswer("".join(pieces), last.get("num_output_tokens", 0), len(pieces), tau,
                        last.get("finish_reason", ""))
    write(f"[tau {answer.tau:.2f}: {answer.num_output_tokens} tokens in {answer.num_chunks} streamed chunks, "
          f"acceptance rate {last.get('acceptance_rate', 0.0):.2f}, {answer.finish_reason}; block size {block_size}]")
    return answer
