"""A guarding HTTP front for tritonserver: refuses bodies Triton 2.51 would crash on, passes the rest.

Triton 2.51 (the tritonserver of nvidia-pytriton 0.7.0) parses HTTP bodies with a recursive JSON parser:
one request nested ~60,000 deep kills the whole server with SIGSEGV. The fix
(triton-inference-server/common#156, iterative parsing) first shipped in Triton 2.69 (NGC 26.05), so
every deployment on the pip tritonserver runs Triton's HTTP on a private loopback port behind this front.

What it does, per request:
- reads the body (at most `max_body_bytes`, else 413), and refuses with 400 a body whose JSON nests deeper
  than `max_json_depth` (non-recursive scan, json_depth.py; with Triton's binary tensor extension only the
  JSON header, `Inference-Header-Content-Length` bytes, is JSON);
- sends everything else to Triton unchanged and streams the answer back as it comes (SSE of
  generate_stream included); a client that disconnects closes the upstream connection, which cancels the
  request in Triton as a direct disconnect would;
- when Triton goes away mid-answer (its process died), an SSE stream ends with an error event in Triton's
  own format ({"error": ...}), any other answer is cut, so no client waits for a response that cannot come.

gRPC is protobuf and never reaches this parser; it is not proxied.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from dflash_trt.serving.json_depth import exceeds_depth

log = logging.getLogger("dflash_trt.http_guard")

# Triton's own default --http-max-input-size (64 MiB): the front refuses nothing Triton would accept by size.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# Far beyond any real request: a tensor of rank R nests R + 3 levels in an /infer body.
DEFAULT_MAX_JSON_DEPTH = 100
BINARY_HEADER = "Inference-Header-Content-Length"
# Headers that describe one connection, not the message: never forwarded (RFC 9110 7.6.1), plus those the
# front recomputes (Host, Content-Length) and Content-Encoding of requests (aiohttp hands the body over
# decompressed).
_HOP_BY_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer", "Trailers",
    "Transfer-Encoding", "Upgrade", "Host", "Content-Length"))
_REQUEST_DROPPED = _HOP_BY_HOP | {"content-encoding"}


def error_response(status: int, message: str) -> web.Response:
    """An error in Triton's HTTP format."""
    return web.json_response({"error": message}, status=status)


def json_part(body: bytes, headers) -> bytes:
    """The JSON part of a body: all of it, or the header of a binary-tensor request."""
    length = headers.get(BINARY_HEADER)
    if length is None:
        return body
    try:
        return body[: max(int(length), 0)]
    except ValueError:
        return body  # Triton refuses the request itself; scan everything meanwhile


def create_app(upstream: str, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               max_json_depth: int = DEFAULT_MAX_JSON_DEPTH) -> web.Application:
    """The front's aiohttp application, forwarding to `upstream` (http://host:port)."""
    app = web.Application(client_max_size=max_body_bytes)

    async def open_session(app):
        # No total timeout: a generation streams for as long as it needs. No decompression: bytes pass as they
        # are. One connection per request (force_close): on SIGTERM Triton 2.51 waits for every open HTTP
        # connection before it drains, so an idle pooled one would hold its shutdown for the whole exit timeout.
        app["session"] = ClientSession(upstream, timeout=ClientTimeout(total=None, sock_connect=10),
                                       connector=TCPConnector(limit=0, force_close=True), auto_decompress=False)
        yield
        await app["session"].close()

    app.cleanup_ctx.append(open_session)

    async def forward(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.read()  # aiohttp stops at client_max_size (after decompression)
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, f"request body is larger than {max_body_bytes} bytes")
        if body and exceeds_depth(json_part(body, request.headers), max_json_depth):
            log.warning("refused %s %s: JSON nested deeper than %d", request.method, request.path, max_json_depth)
            return error_response(400, f"JSON in the request body nests deeper than {max_json_depth} levels")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _REQUEST_DROPPED}
        session: ClientSession = request.app["session"]
        try:
            upstream_response = await session.request(request.method, request.rel_url, headers=headers,
                                                      data=body or None, allow_redirects=False)
        except (ClientError, OSError) as error:
            return error_response(502, f"Triton is not reachable behind the HTTP guard: {error}")
        try:
            return await _relay(request, upstream_response)
        finally:
            upstream_response.close()  # also on a client disconnect (cancellation): Triton sees it

    app.router.add_route("*", "/{tail:.*}", forward)
    return app


async def _relay(request: web.Request, upstream) -> web.StreamResponse:
    """Stream Triton's answer to the client as it arrives."""
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    for name, value in upstream.headers.items():
        if name.lower() not in _HOP_BY_HOP:
            response.headers.add(name, value)
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    await response.prepare(request)
    event_stream = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
    try:
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
    except (ClientError, OSError):
        if not event_stream:
            raise  # aborts the connection: the client sees a cut answer, not a complete one
        message = "the stream ended before its final response: tritonserver stopped (see the server's log)"
        await response.write(b"data: " + json.dumps({"error": message}).encode() + b"\n\n")
    await response.write_eof()
    return response


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_trt.serving.http_guard", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=parse_address, required=True, help="HOST:PORT the clients call")
    parser.add_argument("--upstream", type=parse_address, required=True, help="HOST:PORT of Triton's HTTP")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--max-json-depth", type=int, default=DEFAULT_MAX_JSON_DEPTH)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="http-guard: %(message)s", stream=sys.stderr)
    host, port = args.listen
    upstream = "http://%s:%d" % args.upstream
    app = create_app(upstream, args.max_body_bytes, args.max_json_depth)
    log.info("listening on %s:%d, forwarding to %s (body <= %d bytes, JSON depth <= %d)",
             host, port, upstream, args.max_body_bytes, args.max_json_depth)
    # handler_cancellation: a client that goes away cancels its handler, which closes the upstream request.
    web.run_app(app, host=host, port=port, handler_cancellation=True, shutdown_timeout=5, print=None,
                access_log=None, handle_signals=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
