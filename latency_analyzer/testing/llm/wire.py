"""The OpenAI wire format of every test-bed server: chunks, whole bodies, errors, SSE framing.

:class:`OpenAIEncoder` builds the ``chat.completion.chunk`` / ``text_completion`` payloads of
one response, as vLLM shapes them; :func:`sse` frames one as a server-sent event. The
HTTP/1.1 and HTTP/2 LLM servers and the busy server all write their streams through it, so a
client sees one format whichever server it talks to.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .behavior import Behavior

__all__ = [
    "DONE",
    "OpenAIEncoder",
    "error_body",
    "model_name",
    "sse",
    "token_text",
    "token_texts",
    "usage",
]

_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}


def sse(payload: Mapping[str, Any] | str) -> bytes:
    """Frame one server-sent event: ``data: ...`` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


#: The event that ends every OpenAI stream.
DONE = sse("[DONE]")


def token_text(index: int) -> str:
    """Return the text of output token ``index``: one fixed-width word, ``"tok0042 "``."""
    return f"tok{index % 10000:04d} "


def token_texts(behavior: Behavior, chat: bool, start: int, stop: int) -> tuple[str, str]:
    """Return (reasoning, content) text of tokens ``start..stop-1`` under ``behavior``.

    The first ``reasoning_tokens`` tokens are reasoning (chat only); the first
    ``empty_tokens`` and last ``empty_last_tokens`` have empty text.
    """
    b = behavior
    split = min(max(b.reasoning_tokens if chat else 0, start), stop)
    visible = range(b.empty_tokens, b.tokens - b.empty_last_tokens)

    def text(i: int) -> str:
        return token_text(i) if i in visible else ""

    reasoning = "".join(text(i) for i in range(start, split))
    return reasoning, "".join(text(i) for i in range(split, stop))


def model_name(body: Mapping[str, Any], default: str) -> str:
    """The model a response names: the request's ``model``, else the server's ``default``."""
    model = body.get("model")
    return model if isinstance(model, str) else default


def usage(prompt: int, completion: int, reasoning: int = 0) -> dict[str, Any]:
    """The ``usage`` object: token counts (reasoning ones in the details, when any)."""
    counts: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if reasoning:
        counts["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return counts


def error_body(status: int, message: str) -> dict[str, Any]:
    """vLLM's error body shape."""
    kind = _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


@dataclass(frozen=True)
class OpenAIEncoder:
    """The payloads of one response.

    Attributes:
        request_id: the ``id`` of every payload.
        model: the ``model`` of every payload.
        chat: ``/v1/chat/completions`` (deltas, messages) or ``/v1/completions`` (text).
        created: the ``created`` Unix time (None: left out).
    """

    request_id: str
    model: str
    chat: bool = True
    created: int | None = None

    def envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        """A streamed chunk around ``choices``."""
        payload: dict[str, Any] = {
            "id": self.request_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
        }
        if self.created is not None:
            payload["created"] = self.created
        payload.update(model=self.model, choices=choices)
        return payload

    def token_chunk(
        self, content: str, reasoning: str = "", finish: str | None = None
    ) -> dict[str, Any]:
        """The chunk carrying ``reasoning`` then ``content`` text (``finish``: its reason)."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if not self.chat:
            choice["text"] = reasoning + content
            return self.envelope([choice])
        delta: dict[str, Any] = {"reasoning_content": reasoning} if reasoning else {}
        if content or not reasoning:
            delta["content"] = content
        choice["delta"] = delta
        return self.envelope([choice])

    def tokens_chunk(self, behavior: Behavior, start: int, stop: int) -> dict[str, Any]:
        """The chunk carrying tokens ``start..stop-1`` (the last one's reason: "length")."""
        finish = "length" if stop == behavior.tokens else None
        reasoning, content = token_texts(behavior, self.chat, start, stop)
        return self.token_chunk(content, reasoning, finish)

    def role_chunk(self) -> dict[str, Any]:
        """vLLM's first chat chunk: the assistant role and empty content."""
        delta = {"role": "assistant", "content": ""}
        return self.envelope([{"index": 0, "delta": delta, "logprobs": None}])

    def usage_for(self, behavior: Behavior, prompt: int, completion: int) -> dict[str, Any]:
        """The ``usage`` of ``completion`` tokens (the first ones reasoning, in a chat)."""
        reasoning = min(behavior.reasoning_tokens, completion) if self.chat else 0
        return usage(prompt, completion, reasoning)

    def usage_chunk(self, counts: Mapping[str, Any]) -> dict[str, Any]:
        """The closing ``choices: []`` chunk carrying ``usage``."""
        final = self.envelope([])
        final["usage"] = dict(counts)
        return final

    def body(self, content: str, reasoning: str, counts: Mapping[str, Any]) -> dict[str, Any]:
        """The non-streamed response body."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if reasoning:
                message["reasoning_content"] = reasoning
            choice["message"] = message
        else:
            choice["text"] = reasoning + content
        whole = self.envelope([choice])
        whole["object"] = "chat.completion" if self.chat else "text_completion"
        whole["usage"] = dict(counts)
        return whole
