"""An OpenAI-compatible HTTP server over the generation driver (``mtp-bindings serve``).

Why it exists: most Python LLM tooling talks to models through the OpenAI HTTP API. This module
puts one loaded :class:`~mtp_bindings.llama_model.Model` (optionally with its MTP assistant) behind
that API, so those tools get MTP speculative decoding without code changes.

Endpoints:

* ``POST /v1/chat/completions`` (also ``/chat/completions``) and ``POST /v1/completions``: OpenAI's
  request and response formats, streaming (server-sent events, ``data: {chunk}``, then ``data: [DONE]``) or not.
  Non-streaming responses and the last stream chunk carry OpenAI ``usage`` and llama-server-style
  ``timings`` (``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``,
  ``predicted_per_second``, ``draft_n``, ``draft_n_accepted``).
* ``GET /v1/models`` (also ``/models``; ``/v1/models/{id}``: one model, 404 for another id),
  ``GET /health`` and ``/v1/health`` (never need the API key), ``GET /metrics`` (Prometheus text).
* llama-server's native ``POST /completion`` (also ``/completions``, as there) in its shapes, whole
  and streamed (:mod:`.llama_completion`), and ``GET /slots``.
* llama-server's ``POST /tokenize``, ``POST /detokenize`` and ``GET /props``, in its shapes
  (:mod:`.native_routes`), and ``POST /apply-template`` (a chat request's prompt, ``{"prompt"}``).

Chats are rendered with the GGUF's template, ``serve --chat-template FILE``'s, or Gemma 4's format
(:mod:`mtp_bindings.chat.template`), with the request's ``tools`` and ``chat_template_kwargs``; the
reply is split (:mod:`mtp_bindings.chat.reply`) into ``content``, ``reasoning_content`` (the thinking
channel) and ``tool_calls`` (``tool_choice`` ``auto`` or ``none``), whole and streamed.

Requests take the OpenAI fields that map onto :func:`~mtp_bindings.generation.driver.generate`
(``n_predict``/``max_completion_tokens``/``max_tokens``, in llama-server's order, ``temperature``, ``top_p``, ``seed``, ``stop``,
``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``stream``,
``stream_options.include_usage``, ``logprobs``/``top_logprobs`` (chat) and ``logprobs`` (text: the number
of alternatives); ``n`` must be 1) and llama-server's extras (``top_k``, ``min_p``, ``repeat_penalty``,
``repeat_last_n``, ``n_predict``, ``speculative.n_max`` -- flat key or nested object -- and
``draft_n_max``), and structured output (``response_format``, ``grammar``, ``json_schema``:
:mod:`.structured`). A field we do not implement that would change the output (a forced
tool call, llama.cpp samplers we lack, ...) is a 400 naming it; llama-server's fields that change
nothing here are documented hints (one table, :mod:`.unsupported`, checked against llama-server's
source by the tests); other unknown fields are ignored, since OpenAI clients send extras; a known field of
the wrong type or out of range, bad JSON, or a prompt that does not fit the context is a 400 with
OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``. User input never yields
a 5xx.

Concurrency: the server owns ``n_slots`` llama.cpp contexts on the one shared model, each served
by its own worker thread. A request is tokenized off the event loop, then queued; the first free
slot takes it (FIFO), so at most ``n_slots`` generations run at once and the rest wait in the
queue (``mtp_requests_queued`` in ``/metrics``). Workers hand pieces back to the event loop
through a per-request asyncio queue. Each slot keeps its last request's KV: the next one decodes
only what follows the common prefix (``cache_prompt``). A client that disconnects -- while queued, mid-stream, or waiting for a non-streamed
reply -- cancels its generation: a queued one leaves the queue at once (``/health`` and the
metrics stop counting it), a running one stops at the next round, drains any MTP draft in
flight and its worker takes the next request.

Length: a request that sets no ``max_tokens`` (nor ``max_completion_tokens``/``n_predict``) gets
at most the server's ``n_predict`` tokens (``DEFAULT_N_PREDICT``; -1: until the context is full),
like llama-server's ``-n``: one forgotten limit must not hold a slot for many minutes.

Shutdown (Ctrl-C / SIGTERM): the server stops accepting connections, cancels every generation at
once (queued or running) and answers each open request with a 503 ``server_shutting_down`` error
-- a JSON error body, or for a stream an error event after the text sent so far -- then exits.

Logprobs and ``usage.completion_tokens`` count the tokens of the returned text: a stop string's
tokens are in neither (:mod:`.accounting`); ``timings.predicted_n`` counts every token decoded.
Sampling defaults are the library's one set (:data:`mtp_bindings.config.params.SAMPLING_DEFAULTS`), and a request
samples with llama-server's sampler order through llama.cpp's own chain (:mod:`mtp_bindings.generation.chain`).

Security: binds 127.0.0.1 unless told otherwise; with ``api_key`` set every route but
``/health`` needs ``Authorization: Bearer <key>`` or ``X-Api-Key: <key>``. CORS as llama-server:
any origin unless ``cors_origins`` names some; preflights answered without the key.

The package, one job a module, each importing only the ones listed before it:

* :mod:`.errors` -- OpenAI-shaped errors; :mod:`.unsupported` -- fields refused by name;
  :mod:`.schemas` -- request models and body parsing; :mod:`.params` -- request -> generation
  arguments; :mod:`.prompts` -- prompts as tokens; :mod:`.accounting` -- the tokens the text holds; :mod:`.native_routes` -- the bodies of ``/tokenize``,
  ``/detokenize`` and ``/props``; :mod:`.logprobs` -- token logprobs in OpenAI's shapes;
* :mod:`.metrics` -- counters and ``/metrics`` (prometheus_client, with llama-server and vLLM
  aliases); :mod:`.slots` -- contexts and their worker threads; :mod:`.responses` -- response
  bodies; :mod:`.streaming` -- server-sent events;
* :mod:`.auth` -- the API key; :mod:`.handlers` -- what each route does; :mod:`.llama_completion`
  -- llama-server's ``/completion``; :mod:`.embeddings` -- ``/v1/embeddings``, ``/embedding(s)``
  (``serve --embeddings``); :mod:`.slot_state` -- ``POST /slots/{id}?action=save|restore|erase``
  (``--slot-save-path``); :mod:`.app` -- the app factory; :mod:`.runner` -- the socket, uvicorn and
  shutdown.
"""

from __future__ import annotations

from .app import DEFAULT_N_PREDICT, ROUTES, create_app
from .errors import APIError
from .params import DraftDefaults, generation_kwargs
from .runner import bind_socket, serve
from .schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest

__all__ = ["APIError", "ChatCompletionRequest", "CompletionRequest", "DEFAULT_N_PREDICT", "DraftDefaults",
           "GenerationRequest", "ROUTES", "bind_socket", "create_app", "generation_kwargs", "serve"]
