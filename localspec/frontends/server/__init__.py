"""`localspec serve`: an OpenAI-compatible HTTP API over one loaded pair, with Predicted Outputs.

FastAPI (on Starlette, served by uvicorn) because its request models validate every field with
types and ranges, so each bad field becomes an OpenAI-shaped 400 naming it, and it gives
server-sent-event streaming and an OpenAPI schema (/docs) for free.

One pair serves one generation at a time: requests wait in arrival order in a bounded queue (503
with Retry-After beyond it). Every call into llama.cpp runs on one worker thread, so a client that
disconnects mid-stream stops its generation at the next round and the next request starts at once.
A request that shares a prefix with the cached context (the next turn of a chat, the same system
prompt) decodes only what is new: the target's cache keeps the longest common prefix.

The package: errors (OpenAI's error shape), schemas (request bodies), guard (hosts, keys, body limits,
admission), http (the connection's header timeout), worker (the queue, the llama thread, the bounded buffer
between a generation and its client), shapes (how an endpoint answers: chat and text completions' chunks and
usage), responses_api (OpenAI's Responses API: its request read as a chat, its output items and events), service
(a request turned into a generation), app (the routes) and run (uvicorn with its limits).
"""

from localspec.frontends.server.app import create_app

__all__ = ["create_app"]
