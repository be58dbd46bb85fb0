"""`localspec serve`: an OpenAI-compatible HTTP API over one loaded pair, with Predicted Outputs.

FastAPI (on Starlette, served by uvicorn) because its request models validate every field with
types and ranges, so each bad field becomes an OpenAI-shaped 400 naming it, and it gives
server-sent-event streaming and an OpenAPI schema (/docs) for free.

One pair serves one generation at a time: requests wait in arrival order in a bounded queue (503
with Retry-After beyond it). Every call into llama.cpp runs on one worker thread, so a client that
disconnects mid-stream stops its generation at the next round and the next request starts at once.
A request that shares a prefix with one served before (the next turn of a chat, the same system
prompt, after a restart too) decodes only what is new: the prompt cache keeps the states of several prefixes.

The package: one module an endpoint, each with its request, its answer's shape and its route (chat:
chat completions; completions: text completions and fill-in-the-middle; responses: OpenAI's Responses API, its
input items read as a chat, its output items and events), what they share (schemas: the common request fields
and checks; shapes: the Shape protocol, chunks, usage), settings (ServerSettings: where it listens, whom it
answers, its limits), errors (OpenAI's error shape), guard (hosts, keys, body limits, admission), http (the
connection's timeouts and cap), worker (the queue, the llama thread, the bounded buffer between a generation and
its client), service (a request turned into a generation, answered whole or streamed), app (the routes wired)
and run (uvicorn with its limits).
"""

from localspec.frontends.server.app import create_app

__all__ = ["create_app"]
