"""The FastAPI app: OpenAI routes, server-sent events, errors in OpenAI's format, client disconnects.

A client that goes away (a closed stream, or a non-streaming request whose connection drops) has
its Triton request cancelled: every wait on Triton races a watcher of the HTTP connection.

Hostile input: a POST must say `Content-Type: application/json` (a browser's cross-site form or
text/plain POST, which needs no CORS preflight, gets a 415; no CORS headers are ever sent), its body
is read up to a bound derived from the prompt limit (413 beyond), and the prompt is refused by its
size before it is tokenized. Parsing, chat templating and token counting run in a worker thread, so
a large request never stalls the event loop that serves every other client. With an API key
configured, /v1 routes need `Authorization: Bearer <key>` (401 otherwise); /health stays open for
probes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from dflash_trt.gateway import responses as out
from dflash_trt.gateway.errors import APIError, model_not_found, server_error
from dflash_trt.gateway.guards import check_api_key, read_json_body
from dflash_trt.gateway.model import COMPLETION_DEFAULT_MAX_TOKENS, GatewayConfig, ServedModel
from dflash_trt.gateway.protocol import ChatRequest, CompletionRequest, parse_chat, parse_completion, parse_json
from dflash_trt.gateway.triton import Piece, TritonEnsemble

log = logging.getLogger("dflash_trt.gateway")
CANCELLED_LOG = "generation cancelled in Triton before its end (the client went away)"


class ClientGone(Exception):
    """The HTTP client disconnected before the answer was complete."""


@dataclass(frozen=True)
class Prepared:
    """A validated request, ready for Triton. sent: the text_input; prompt: what it becomes after Triton's
    preprocessing (they differ when the repository applies the chat template itself)."""

    parsed: CompletionRequest | ChatRequest
    sent: str
    prompt: str
    num_prompt_tokens: int
    max_tokens: int


def create_app(config: GatewayConfig, model: ServedModel):
    """The ASGI app serving `model` through the Triton ensemble at config.triton_grpc."""

    @asynccontextmanager
    async def lifespan(app):
        # The asyncio gRPC channel belongs to the server's event loop: create it there.
        app.state.ensemble = TritonEnsemble(config.triton_grpc, config.ensemble)
        yield
        await app.state.ensemble.close()

    app = FastAPI(title="dflash-trt OpenAI-compatible API", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.exception_handler(APIError)
    async def api_error(_request, error: APIError):
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(HTTPException)
    async def http_error(_request, error: HTTPException):
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(error.status_code, str(error.detail), kind).body(), status_code=error.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request, error: RequestValidationError):
        return JSONResponse(APIError(400, str(error)).body(), status_code=400)

    @app.get("/health")
    async def health():
        if config.server_health_url:
            problem = await asyncio.to_thread(_server_problem, config.server_health_url)
            if problem:
                raise server_error(f"the server is not ready: {problem}", 503)
        if await app.state.ensemble.is_ready():
            return {"status": "ok"}
        raise server_error(f"Triton at {config.triton_grpc} is not ready", 503)

    async def authorize(request: Request) -> None:
        if config.api_key is not None:
            check_api_key(request.headers.get("authorization"), config.api_key)

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models():
        return out.model_list(model.name, model.created)

    @app.get("/v1/models/{name:path}", dependencies=[Depends(authorize)])
    async def model_card(name: str):
        if name != model.name:
            raise model_not_found(name, model.name)
        return out.model_card(model.name, model.created)

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(request: Request):
        raw = await read_json_body(request, model.max_body_bytes)
        return await _answer(request, await asyncio.to_thread(prepare_completion, raw, model))

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(request: Request):
        raw = await read_json_body(request, model.max_body_bytes)
        return await _answer(request, await asyncio.to_thread(prepare_chat, raw, model))

    async def _answer(request, prepared: Prepared):
        try:
            return await _generate(request, prepared)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; 499 is the log's "client closed request"

    async def _generate(request, prepared: Prepared):
        parsed, prompt, num_prompt_tokens = prepared.parsed, prepared.prompt, prepared.num_prompt_tokens
        reply = out.Reply("completion" if isinstance(parsed, CompletionRequest) else "chat", model.name)
        echo = prompt if getattr(parsed, "echo", False) else ""
        generation = app.state.ensemble.start(prepared.sent, parsed.sampling, prepared.max_tokens)
        watcher = asyncio.ensure_future(_disconnected(request))
        # A disconnect cancels Triton's request by itself, even if the response body is never iterated
        # (a client gone before the headers were sent).
        watcher.add_done_callback(lambda done: done.cancelled() or _cancel(generation))
        try:
            first = await _next(generation, watcher)  # Triton's errors become HTTP errors before any byte is sent
        except BaseException:
            _stop(generation, watcher)
            raise
        if parsed.stream:
            events = _events(reply, generation, first, watcher, num_prompt_tokens, parsed.include_usage, echo)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            text, last = await _collect(generation, first, watcher)
        finally:
            _stop(generation, watcher)
        return out.full_response(reply, echo + text, last, num_prompt_tokens, model.block_size)

    async def _events(reply, generation, piece: Piece, watcher, num_prompt_tokens: int, include_usage: bool,
                      echo: str) -> AsyncIterator[str]:
        try:
            opening = out.first_chunk(reply)
            if opening is not None:
                yield out.sse(opening)
            if echo:
                yield out.sse(out.text_chunk(reply, echo))
            while not piece.finish_reason:
                if piece.text:
                    yield out.sse(out.text_chunk(reply, piece.text))
                piece = await _next(generation, watcher)
            yield out.sse(out.final_chunk(reply, piece, model.block_size))
            if include_usage:
                yield out.sse(out.usage_chunk(reply, piece, num_prompt_tokens, model.block_size))
            yield out.DONE
        except ClientGone:
            return
        except APIError as error:  # after the first byte the status is sent: report in the stream, as OpenAI does
            yield out.sse(error.body())
            yield out.DONE
        finally:
            _stop(generation, watcher)  # also when Starlette cancels this generator on a disconnect

    return app


def _server_problem(url: str) -> str:
    """Why the server's model-aware readiness says no ("" when it says ready)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return "" if response.status == 200 else f"status {response.status}"
    except urllib.error.HTTPError as error:
        try:
            state = json.loads(error.read())
            return state.get("problem") or state.get("status") or f"status {error.code}"
        except ValueError:
            return f"status {error.code}"
    except (urllib.error.URLError, OSError) as error:
        return f"{url} does not answer ({error})"


def _check_model(name: str, model: ServedModel) -> None:
    if name != model.name:
        raise model_not_found(name, model.name)


# The two below run in a worker thread: JSON parsing, chat templating and tokenizing cost CPU time in
# proportion to the request, which must not stall the event loop.

def prepare_completion(raw: bytes, model: ServedModel) -> Prepared:
    parsed = parse_completion(parse_json(raw))
    _check_model(parsed.model, model)
    prompt = model.completion_prompt(parsed.prompt)
    model.check_prompt_size(prompt, "prompt")
    return _prepared(parsed, prompt, prompt, model, COMPLETION_DEFAULT_MAX_TOKENS, "prompt")


def prepare_chat(raw: bytes, model: ServedModel) -> Prepared:
    parsed = parse_chat(parse_json(raw))
    _check_model(parsed.model, model)
    model.check_prompt_size("".join(m["content"] for m in parsed.messages), "messages")  # before templating
    sent, prompt = model.chat_prompt(parsed.messages, parsed.template_kwargs)
    model.check_prompt_size(prompt, "messages")
    return _prepared(parsed, sent, prompt, model, None, "messages")


def _prepared(parsed, sent: str, prompt: str, model: ServedModel, default_max: int | None, param: str) -> Prepared:
    num_prompt_tokens = model.formatter.count_tokens(prompt)
    max_tokens = model.max_tokens(parsed.sampling.max_tokens, num_prompt_tokens, default_max, param)
    return Prepared(parsed, sent, prompt, num_prompt_tokens, max_tokens)


async def _collect(generation, piece: Piece, watcher) -> tuple[str, Piece]:
    texts = [piece.text]
    while not piece.finish_reason:
        piece = await _next(generation, watcher)
        texts.append(piece.text)
    return "".join(texts), piece


async def _next(generation, watcher: asyncio.Future) -> Piece:
    """The next piece from Triton, or ClientGone as soon as the HTTP client disconnects."""
    step = asyncio.ensure_future(generation.next())
    step.add_done_callback(_consume)
    try:
        done, _ = await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this task was cancelled (Starlette saw the disconnect first)
        step.cancel()
        raise
    if step in done:
        return step.result()
    step.cancel()
    raise ClientGone()


def _cancel(generation) -> None:
    """Stop a generation that has not ended (its client is gone); synchronous, see _stop."""
    if not generation.is_done:
        generation.cancel()
        log.info(CANCELLED_LOG)


def _stop(generation, watcher: asyncio.Future) -> None:
    """Synchronous cleanup: nothing may be awaited in a task that is being cancelled."""
    watcher.cancel()
    _cancel(generation)


def _consume(task: asyncio.Future) -> None:
    # A read abandoned on a disconnect ends with an error nobody waits for: retrieve it so that
    # asyncio does not log it as "never retrieved".
    if not task.cancelled():
        task.exception()


async def _disconnected(request) -> None:
    """Returns when the client closes the connection (the body was read: only the disconnect is left)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
