"""What the gateway checks before it reads a request: the API key, the media type and the size of the body."""

from __future__ import annotations

import hmac

from fastapi import Request

from dflash_trt.gateway.errors import APIError

DRAIN_FACTOR = 8  # bodies up to this many times the bound are read (and dropped) before the 413


def check_api_key(header: str | None, api_key: str) -> None:
    """401 in OpenAI's shape unless the Authorization header is `Bearer <api_key>` (compared in constant time)."""
    if not header:
        raise APIError(401, "You didn't provide an API key: send it in the header 'Authorization: Bearer <key>'",
                       code="invalid_api_key")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError(401, "Incorrect API key provided", code="invalid_api_key")


async def read_json_body(request: Request, max_bytes: int) -> bytes:
    """The body of a POST that declares JSON (415 otherwise), read up to max_bytes (413 beyond)."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise APIError(415, f"Content-Type must be application/json, got {media_type or 'none'}",
                       code="unsupported_media_type")
    too_large = APIError(413, f"The request body is larger than this server accepts ({max_bytes} bytes)",
                         code="request_too_large")
    # A body over the bound is read on and dropped, so that the client, still sending, can read the 413 (an
    # answer sent mid-upload reaches most clients as a reset connection); only a far larger one is cut off.
    drain_bytes = DRAIN_FACTOR * max_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > drain_bytes:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > drain_bytes:
            break
        if size <= max_bytes:
            chunks.append(chunk)
    if size > max_bytes:
        raise too_large
    return b"".join(chunks)
