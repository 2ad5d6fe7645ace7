"""OpenAI request parsing and response shapes, with no Django and no Ray: JSON in, dataclasses out.

    parse_request(b'{"model": "chat", "prompt": "hi"}', endpoint=COMPLETIONS) -> CompletionRequest
    parse_request(b'{"model": "chat", "top_p": 0.5, ...}', ...)  -> GatewayError(400, param="top_p")

What is accepted (anything else is a 400 naming the field, so a typo is never silently ignored):

- `model` (required): the deployment's name in the token's team.
- `prompt` (completions, required): a non-empty string, or a list holding exactly one string.
- `messages` (chat, required): a non-empty list of `{"role": "system"|"user"|"assistant", "content": str}`
  (`content` may also be a list of `{"type": "text", "text": str}` parts; `name` is accepted and ignored).
  The built-in model has no chat template of its own, so messages are rendered as one line each,
  `"<role>: <content>\\n"`, followed by `"assistant: "` (see `render_chat_prompt`).
- `max_tokens` 1..4096 (default 16 for completions, 128 for chat; chat also takes the newer name
  `max_completion_tokens`), `temperature` 0..2 (default 1), `top_p` (only 1 is supported), `n` (only 1),
  `stop` (a string or a list of up to 4 non-empty strings), `seed` (an integer), `stream` (bool),
  `stream_options` (`{"include_usage": bool}`, only with `stream: true`), `ignore_eos` (bool, vLLM's
  extension that benchmarks use), `user` (a string, ignored).
- Fields that clients and benchmark tools send with their neutral value are accepted at that value
  only: `frequency_penalty`/`presence_penalty` 0, `repetition_penalty` 1 (vLLM), and for completions
  `echo` false, `best_of` 1, `logprobs` null; for chat `logprobs` false. Any other value is a 400.
  `null` for any optional field means its default.

Tokens are UTF-8 bytes (the built-in model's ByteTokenizer), so a prompt's length in tokens is its
length in bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
ENDPOINTS = (COMPLETIONS, CHAT_COMPLETIONS)

MAX_TOKENS_LIMIT = 4096
DEFAULT_MAX_TOKENS = {COMPLETIONS: 16, CHAT_COMPLETIONS: 128}
MAX_STOP_STRINGS = 4
CHAT_ROLES = ("system", "user", "assistant")
SEED_RANGE = (-(2**63), 2**63 - 1)

_COMMON_FIELDS = ("model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "stream",
                  "stream_options", "ignore_eos", "user")
# Accepted only at the value that changes nothing (a value of None always means "the default").
_NEUTRAL_COMMON = {"frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1}
_NEUTRAL = {
    COMPLETIONS: {**_NEUTRAL_COMMON, "echo": False, "best_of": 1, "logprobs": None},
    CHAT_COMPLETIONS: {**_NEUTRAL_COMMON, "logprobs": False},
}
_FIELDS = {
    COMPLETIONS: (*_COMMON_FIELDS, "prompt", *_NEUTRAL[COMPLETIONS]),
    CHAT_COMPLETIONS: (*_COMMON_FIELDS, "messages", "max_completion_tokens", *_NEUTRAL[CHAT_COMPLETIONS]),
}


# --------------------------------------------------------------------------------------------------- errors


class GatewayError(Exception):
    """An error answered in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, message: str, *, status: int = 400, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind  # the body's "type"
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    @property
    def retry_after(self) -> str | None:
        """The Retry-After header: whole seconds, at least 1 (None: no header)."""
        if self.retry_after_s is None:
            return None
        return str(max(1, math.ceil(self.retry_after_s)))


def invalid(param: str | None, message: str, code: str | None = None) -> GatewayError:
    return GatewayError(message, status=400, kind="invalid_request_error", param=param, code=code)


# --------------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class CompletionRequest:
    """A validated request of either endpoint; chat requests carry their messages and the rendered prompt."""

    endpoint: str
    model: str
    prompt: str
    max_tokens: int
    temperature: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    messages: tuple[ChatMessage, ...] | None = None

    @property
    def chat(self) -> bool:
        return self.endpoint == CHAT_COMPLETIONS

    @property
    def prompt_param(self) -> str:
        """The field a prompt-level error names: `messages` for chat, `prompt` otherwise."""
        return "messages" if self.chat else "prompt"

    def prompt_tokens(self) -> list[int]:
        """The prompt as the built-in model's tokens: UTF-8 bytes (jobs.runtime.lm_config.ByteTokenizer)."""
        return list(self.prompt.encode("utf-8"))

    def backend_request(self, *, seed: int) -> dict:
        """The request dict of ServingBackend.stream_completion; `seed` is used when the client gave none."""
        return {"prompt_tokens": self.prompt_tokens(), "max_tokens": self.max_tokens,
                "temperature": self.temperature, "seed": self.seed if self.seed is not None else seed,
                "stop": list(self.stop), "ignore_eos": self.ignore_eos}


def parse_json_body(raw: bytes | str) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(None, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:  # `[[[[...`: deeper than Python's recursion limit
        raise invalid(None, "the request body is not valid JSON: nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid(None, f"the request body must be a JSON object, got {_json_type(body)}")
    return body


def parse_request(raw: bytes | str | dict, *, endpoint: str) -> CompletionRequest:
    """Validate a completions or chat completions body (bytes, text or an already parsed dict)."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"unknown endpoint {endpoint!r}")
    body = raw if isinstance(raw, dict) else parse_json_body(raw)
    _check_text(body)
    allowed = _FIELDS[endpoint]
    for name in body:
        if name not in allowed:
            raise invalid(name, f"unknown field {name!r}; this endpoint takes: {', '.join(sorted(allowed))}",
                          code="unknown_field")
    for name, neutral in _NEUTRAL[endpoint].items():
        value = body.get(name)
        if value is not None and not _same(value, neutral):
            raise invalid(name, f"{name}: only {json.dumps(neutral)} is supported, got {json.dumps(value)}",
                          code="unsupported_value")

    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise invalid("model", "model: required, the name of one of your team's deployments (see GET /v1/models)")

    messages = None
    if endpoint == COMPLETIONS:
        prompt = _prompt(body.get("prompt"))
    else:
        messages = _messages(body.get("messages"))
        prompt = render_chat_prompt(messages)

    max_tokens = _max_tokens(body, endpoint)
    temperature = _number(body, "temperature", 0.0, 2.0, default=1.0)
    top_p = _number(body, "top_p", 0.0, 1.0, default=1.0)
    if top_p != 1.0:
        raise invalid("top_p", f"top_p: only 1 is supported (nucleus sampling is not implemented), got {top_p:g}",
                      code="unsupported_value")
    n = _integer(body, "n", 1, 1_000_000, default=1)
    if n != 1:
        raise invalid("n", f"n: only 1 is supported, got {n}", code="unsupported_value")
    seed = _integer(body, "seed", *SEED_RANGE, default=None)
    stream = _boolean(body, "stream", default=False)
    ignore_eos = _boolean(body, "ignore_eos", default=False)
    if body.get("user") is not None and not isinstance(body["user"], str):  # ignored, but a string (before: anything)
        raise invalid("user", f"user: must be a string, got {_json_type(body['user'])}")
    return CompletionRequest(
        endpoint=endpoint, model=model, prompt=prompt, max_tokens=max_tokens, temperature=temperature,
        stop=_stop(body.get("stop")), seed=seed, stream=stream, include_usage=_stream_options(body, stream),
        ignore_eos=ignore_eos, messages=messages,
    )


def _check_text(body: dict) -> None:
    """Every string of the body must be Unicode text that UTF-8 can spell: JSON's `\\u` escapes can write a lone
    surrogate (`"\\ud800"`), which Python's json accepts and which then failed the request with a 500 where the
    prompt became tokens (UTF-8 bytes) or the model name reached the database. A 400 names where it is. (A loop,
    not recursion: a body nested as deep as json takes must not reach the recursion limit here; a place's name is
    only spelled out for the string refused.)"""
    pending: list[tuple[Any, tuple | None]] = [(body, None)]  # (value, (parent's place, key or index))
    while pending:
        value, place = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if not _is_text(key):
                    _refuse_text(key, place)
                pending.append((item, (place, key)))
        elif isinstance(value, list):
            pending.extend((item, (place, i)) for i, item in enumerate(value))
        elif isinstance(value, str) and not _is_text(value):
            _refuse_text(value, place)


def _is_text(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _refuse_text(value: str, place: tuple | None) -> None:
    parts = []
    while place is not None:
        place, key = place
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    where = "".join(reversed(parts)).removeprefix(".")
    bad = next(c for c in value if 0xD800 <= ord(c) <= 0xDFFF)
    raise invalid(where or None, f"{where or 'the request body'}: not valid Unicode text: a lone surrogate "
                                 f"\\u{ord(bad):04x} (a \\u escape of U+D800-U+DFFF must be one half of a pair)")


def render_chat_prompt(messages: tuple[ChatMessage, ...] | list[ChatMessage]) -> str:
    """The chat template: `"<role>: <content>\\n"` per message, then `"assistant: "` for the reply."""
    return "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant: "


def _prompt(value: Any) -> str:
    if isinstance(value, list):
        if len(value) != 1:
            raise invalid("prompt", f"prompt: a list must hold exactly one string (batches are not supported), "
                                    f"got {len(value)} items")
        value = value[0]
    if value is None:
        raise invalid("prompt", "prompt: required")
    if not isinstance(value, str):
        raise invalid("prompt", f"prompt: must be a string (token-id prompts are not supported), got "
                                f"{_json_type(value)}")
    if not value:
        raise invalid("prompt", "prompt: must not be empty")
    return value


def _messages(value: Any) -> tuple[ChatMessage, ...]:
    if value is None:
        raise invalid("messages", "messages: required")
    if not isinstance(value, list) or not value:
        raise invalid("messages", "messages: must be a non-empty list of {role, content} objects")
    out = []
    for i, item in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, f"{where}: must be an object with role and content")
        for key in item:
            if key not in ("role", "content", "name"):
                raise invalid(f"{where}.{key}", f"{where}: unknown field {key!r}; a message takes role, content "
                                                f"and name", code="unknown_field")
        role = item.get("role")
        if role not in CHAT_ROLES:
            raise invalid(f"{where}.role", f"{where}.role: must be one of {', '.join(CHAT_ROLES)}, got "
                                           f"{json.dumps(role)}")
        if "name" in item and not isinstance(item["name"], str):
            raise invalid(f"{where}.name", f"{where}.name: must be a string")
        out.append(ChatMessage(role=role, content=_content(item.get("content"), f"{where}.content")))
    return tuple(out)


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for j, part in enumerate(value):
            if (not isinstance(part, dict) or part.get("type") != "text" or set(part) != {"type", "text"}
                    or not isinstance(part["text"], str)):
                raise invalid(f"{where}[{j}]", f"{where}[{j}]: only text parts {{\"type\": \"text\", \"text\": "
                                               f"str}} are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise invalid(where, f"{where}: must be a string, got {_json_type(value)}")


def _max_tokens(body: dict, endpoint: str) -> int:
    name = "max_tokens"
    if endpoint == CHAT_COMPLETIONS and body.get("max_completion_tokens") is not None:
        newer = _integer(body, "max_completion_tokens", 1, MAX_TOKENS_LIMIT, default=None)
        older = _integer(body, "max_tokens", 1, MAX_TOKENS_LIMIT, default=None)
        if older is not None and older != newer:
            raise invalid("max_completion_tokens", "max_completion_tokens and max_tokens disagree; send one")
        return newer
    return _integer(body, name, 1, MAX_TOKENS_LIMIT, default=DEFAULT_MAX_TOKENS[endpoint])


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise invalid("stop", "stop: must be a string or a list of strings")
    if len(items) > MAX_STOP_STRINGS:
        raise invalid("stop", f"stop: at most {MAX_STOP_STRINGS} strings, got {len(items)}")
    if any(not s for s in items):
        raise invalid("stop", "stop: strings must not be empty")
    return tuple(dict.fromkeys(items))


def _stream_options(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise invalid("stream_options", "stream_options: only allowed when stream is true")
    if not isinstance(options, dict):
        raise invalid("stream_options", "stream_options: must be an object like {\"include_usage\": true}")
    for key in options:
        if key != "include_usage":
            raise invalid(f"stream_options.{key}", f"stream_options: unknown field {key!r}; it takes include_usage",
                          code="unknown_field")
    return _boolean(options, "include_usage", default=False, prefix="stream_options.")


def _integer(body: dict, name: str, lo: int, hi: int, *, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"{name}: must be an integer, got {_json_type(value)}")
    if not lo <= value <= hi:
        raise invalid(name, f"{name}: must be between {lo} and {hi}, got {value}")
    return value


def _number(body: dict, name: str, lo: float, hi: float, *, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(name, f"{name}: must be a number, got {_json_type(value)}")
    if not lo <= value <= hi:
        raise invalid(name, f"{name}: must be between {lo:g} and {hi:g}, got {value:g}")
    return float(value)


def _boolean(body: dict, name: str, *, default: bool, prefix: str = "") -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(prefix + name, f"{prefix}{name}: must be true or false, got {_json_type(value)}")
    return value


def _same(value: Any, neutral: Any) -> bool:
    if isinstance(neutral, bool) or isinstance(value, bool):
        return value is neutral
    return isinstance(value, (int, float)) and value == neutral


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value}" if not isinstance(value, float) or math.isfinite(value) else "a non-finite number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


# --------------------------------------------------------------------------------------------------- output text


class OutputText:
    """The text the client sees, from the backend's token events (their `text` is authoritative: the
    serving engine decodes UTF-8 incrementally and may release several tokens' text in one event).

    Stop strings are the backend's job: it receives them, holds back text that could still begin one
    and never emits the stop string itself (inference/runtime/engine.py). As a safety net for a
    backend that does emit it, the gateway cuts the output at a complete stop string that reaches it,
    drops everything after and reports finish_reason "stop"; text already sent cannot be taken back,
    so only the part of the stop string in the newest event is cut.
    """

    def __init__(self, stop: tuple[str, ...] | list[str] = ()) -> None:
        self.stop = tuple(s for s in stop if s)
        self._longest = max((len(s) for s in self.stop), default=0)
        self.text = ""  # released so far
        self.stopped = False  # a complete stop string reached the gateway

    def feed(self, text: str) -> str:
        """One token event's text; returns what to release (all of it, unless a stop string cuts it)."""
        if self.stopped or not text:
            return ""
        released = text
        if self.stop:
            combined = self.text + text
            since = max(0, len(self.text) - self._longest + 1)
            hits = [i for i in (combined.find(s, since) for s in self.stop) if i >= 0]
            if hits:
                released = combined[len(self.text):max(min(hits), len(self.text))]
                self.stopped = True
        self.text += released
        return released

    def finish(self, finish_reason: str | None) -> str:
        """The finish reason to report once the backend is done."""
        return "stop" if self.stopped else (finish_reason or "stop")


# --------------------------------------------------------------------------------------------------- responses


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(request: CompletionRequest, *, response_id: str, created: int, text: str, finish_reason: str,
                    usage: dict, extra: dict) -> dict:
    """A non-streaming answer: `text_completion` or `chat.completion`, with a `fleetyard` extra."""
    if request.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    return {"id": response_id, "object": kind, "created": created, "model": request.model, "choices": [choice],
            "usage": usage, "fleetyard": extra}


def chunk_body(request: CompletionRequest, *, response_id: str, created: int, text: str | None = None,
               role: bool = False, finish_reason: str | None = None, extra: dict | None = None) -> dict:
    """One streamed chunk: `text_completion` (a `text` piece) or `chat.completion.chunk` (a `delta`)."""
    if request.chat:
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
            delta["content"] = ""
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    body = {"id": response_id, "object": kind, "created": created, "model": request.model, "choices": [choice]}
    if request.include_usage:
        body["usage"] = None
    if extra is not None:
        body["fleetyard"] = extra
    return body


def usage_chunk_body(request: CompletionRequest, *, response_id: str, created: int, usage: dict) -> dict:
    """The last chunk when `stream_options.include_usage` is set: no choices, the usage."""
    kind = "chat.completion.chunk" if request.chat else "text_completion"
    return {"id": response_id, "object": kind, "created": created, "model": request.model, "choices": [],
            "usage": usage}


def sse_event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
