"""`pivotrl serve`'s bound on a request's body, checked as the body arrives, before it is parsed.

The body's bound comes from the text bound (`pivotrl.formats.length_bound`): a request's prompts
hold at most `max_request_tokens` tokens together, so their text has at most
`LengthBound.max_bytes(max_request_tokens)` UTF-8 bytes; JSON can spell each byte in at most 6
(`\\u0000`; a 4-byte character is a 12-byte surrogate pair), and the envelope (field names,
sampling settings, tools a template does not render) gets `ENVELOPE_BYTES` more. A body within
the bound is passed on untouched; a larger one is a 400 naming the bound.
"""

from __future__ import annotations

import json
from typing import Any

from pivotrl.formats.length_bound import LengthBound

JSON_BYTES_PER_BYTE = 6
ENVELOPE_BYTES = 1 << 20


def max_body_bytes(bound: LengthBound | None, request_tokens: int) -> int | None:
    """The largest body a request of at most `request_tokens` prompt tokens can need (None: the
    tokenizer has no safe text bound, so neither has the body)."""
    if bound is None:
        return None
    return JSON_BYTES_PER_BYTE * bound.max_bytes(request_tokens, ascii_text=False) + ENVELOPE_BYTES


# OpenAI's error types by status, so clients raise their own exception classes.
_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 499: "ClientClosedRequest",
                500: "InternalServerError", 503: "ServiceUnavailableError"}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "APIError"),
                      "param": param, "code": status}}


class BodyLimit:
    """ASGI middleware: an HTTP request whose body is over `limit` bytes is answered 400 without
    being parsed. The body is read to its end first (and dropped as it comes): a client still
    writing when the server answers and closes reads a reset connection, not the answer."""

    def __init__(self, app: Any, limit: int | None):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self.limit is None:
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        over = declared is not None and declared.isdigit() and int(declared) > self.limit
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body ended: no one to answer
            body = message.get("body", b"")
            size += len(body)
            over = over or size > self.limit
            if not over:
                chunks.append(body)
            more = message.get("more_body", False)
        if over:
            return await _refuse(send, size, self.limit)
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        delivered = False

        async def replay():
            # The body once, then the client's own messages (a disconnect while generating).
            nonlocal delivered
            if not delivered:
                delivered = True
                return whole
            return await receive()

        await self.app(scope, replay, send)


async def _refuse(send, size: int, limit: int) -> None:
    message = (f"the request body has {size:,} bytes, above this server's limit of {limit:,} "
               "bytes (the most text its context and --max-request-tokens can hold, spelled in "
               "JSON, plus the envelope)")
    payload = json.dumps(error_body(400, message)).encode()
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
