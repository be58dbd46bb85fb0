"""The service behind the routes: requests checked, queued on the worker, answered whole or streamed, logged."""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import anyio
from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from localspec.api import ContextFull, Generation, LocalSpec, Options, Prepared, ToolCallStream, prediction_usage
from localspec.errors import LocalspecError, Unsupported
from localspec.frontends.server.errors import ApiError
from localspec.frontends.server.schemas import Common
from localspec.frontends.server.shapes import Served, Shape
from localspec.frontends.server.worker import ClientGone, Leave, Sent, Stalled, Worker, watch_disconnect

Stream = AsyncGenerator[Sent | Generation, None]
# A stream silent this long (a long prompt prefilling: Claude Code's first request is 18,800 tokens, minutes on a
# CPU) says it is alive (Shape.keepalive): Claude Code gives up on a stream without an event for 300 s, and its
# retry started the prefill again.
KEEPALIVE_SECONDS = 15.0


async def ticking(stream: Stream, every: float) -> AsyncGenerator[Sent | Generation | None, None]:
    """The stream's items, and None after every `every` seconds without one."""
    pending: asyncio.Future[Sent | Generation] | None = None
    try:
        while True:
            pending = pending or asyncio.ensure_future(stream.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield None
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield item
    finally:
        if pending is not None:  # the reader stopped: so does the wait, and what it ended with is taken (a client
            pending.cancel()  # gone meanwhile is no error to log as "never retrieved")
            with contextlib.suppress(BaseException):
                await pending


class Service:
    """What the routes call: requests checked, queued on the worker, answered whole or streamed, logged."""

    def __init__(
        self,
        spec: LocalSpec,
        model_id: str,
        worker: Worker,
        log_prompts: bool,
        say: Callable[[str], None],
    ) -> None:
        self.spec, self.model_id, self.worker, self.log_prompts, self.say = spec, model_id, worker, log_prompts, say

    async def serve(self, request: Request, req: Common, shape: Shape, prompt: Any, max_tokens: int | None) -> Any:
        """Answer one request: a whole JSON response, or a stream of server-sent events."""
        t0 = time.perf_counter()
        if not req.ANY_MODEL:
            self._check_model(req.model)
        req.check()
        prepared = await self.prepare(prompt, max_tokens, req)
        left = Leave()
        watcher = asyncio.create_task(watch_disconnect(request.receive, left))
        ticket = request.scope.get("state", {}).get("ticket") or self.worker.admit()
        stream = self.worker.stream(lambda: self.spec.run(prepared), left, ticket)
        try:
            run = await stream.__anext__()  # waits its turn; errors before decoding are plain 4xx responses
        except ClientGone:
            watcher.cancel()
            return self._gone(request, 0)
        except BaseException:
            watcher.cancel()
            raise
        assert isinstance(run, Generation)
        first: list[float] = []

        def done() -> Served:
            return self._served(request, run, shape, (first or [time.perf_counter()])[0] - t0, prompt)

        if not req.stream:
            try:
                async for _ in stream:
                    first = first or [time.perf_counter()]
            except ClientGone:
                return self._gone(request, len(run.tokens))
            finally:
                watcher.cancel()
                await stream.aclose()
            return JSONResponse(shape.final(done()), headers=shape.headers())
        events = self._events(request, stream, run, shape, len(prepared.tokens), first, done, watcher)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **shape.headers()}
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)

    def _check_model(self, model: str) -> None:
        if model != self.model_id:
            raise ApiError(
                404,
                f"the model '{model}' does not exist here (this server has '{self.model_id}')",
                param="model",
                code="model_not_found",
            )

    def _served(self, request: Request, run: Generation, shape: Shape, first_token: float, prompt: Any) -> Served:
        """A finished generation's answer, its line in the access log said."""
        predicted = None if run.prediction is None else prediction_usage(run.prediction, run.tokens)
        logprobs = None if run.logprobs is None else shape.logprobs(run.logprobs, self.spec.piece)
        served = Served(
            run.content, run.stats, run.seed, predicted, first_token, run.finish_reason, run.tool_calls, logprobs
        )
        st = served.stats
        self.say(
            f"localspec: {request.method} {request.url.path} 200 {st.prompt_tokens}+{st.completion_tokens} "
            f"tokens ({st.cached_tokens} cached), first token {served.first_token:.2f} s, {st.tokens_per_second or 0:.1f} tok/s, "
            f"{st.accepted}/{st.drafted} drafts accepted, {st.finish_reason}"
            + (f"; the prompt cache missed: {st.cache_miss}" if st.cache_miss else "")
            + (f", prompt {prompt!r}" if self.log_prompts else "")
        )
        return served

    async def prepare(self, prompt: Any, max_tokens: int | None, req: Common) -> Prepared:
        """The request made ready (tokenized, its context checked, its grammar compiled: once, before it is queued,
        on a thread beside the decoding), or refused: what cannot fit the context (the prompt, the prediction,
        max_tokens: OpenAI refuses prompt + max_tokens beyond the context too); without max_tokens, the room left."""
        spec, n_ctx, prediction, where = self.spec, self.spec.n_ctx, req.prediction, req.PROMPT_FIELD
        options = Options(  # settings the request leaves out (None) are the server's
            raw=req.RAW,
            stop=req.stops(),
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            min_p=req.min_p,
            seed=req.seed,
            prediction=prediction.text() if prediction else None,
            max_draft=req.speculative_n_max,
            **req.options(),
            **req.cache(),
        )

        try:  # llama.cpp's tokenizer reads only the vocabulary: safe beside decoding
            prepared = await anyio.to_thread.run_sync(spec.prepare, prompt, options)
        except ContextFull as e:
            raise ApiError(400, str(e), param=where, code="context_length_exceeded") from None
        except LocalspecError as e:  # an empty prompt; tools, a suffix or a template the model cannot take
            raise ApiError(400, str(e), param=e.param if isinstance(e, Unsupported) else where) from None
        except ValueError as e:  # a setting the API refuses: "name: why"
            raise ApiError(400, str(e), param=str(e).split(":")[0]) from None
        room = n_ctx - len(prepared.tokens)
        if max_tokens is not None and max_tokens > room and req.CAP_TO_ROOM:
            max_tokens = room
        if max_tokens is not None and max_tokens > room:
            raise ApiError(
                400,
                f"the context holds {n_ctx} tokens: {len(prepared.tokens)} in the prompt leave {room} for the "
                f"answer, not {req.LENGTH_FIELD} = {max_tokens}",
                param=req.LENGTH_FIELD,
                code="context_length_exceeded",
            )
        if prepared.predicted > room:
            raise ApiError(
                400,
                f"the prediction is {prepared.predicted} tokens and the answer has room for {room}",
                param="prediction",
                code="context_length_exceeded",
            )
        return prepared.capped(max_tokens or room)

    async def _deltas(
        self, stream: Stream, run: Generation, shape: Shape, first: list[float]
    ) -> AsyncGenerator[bytes, None]:
        """The answer's text as it comes (tool calls held back as the stream of them says), each piece with its
        tokens' log-probabilities where asked for; `first` gets each piece's time."""
        calls = ToolCallStream(run.tool_names) if run.tool_names else None
        sent = 0  # tokens whose log-probabilities went out

        def logprobs(upto: int | None = None) -> dict[str, Any] | None:
            """The log-probabilities not sent yet, up to the `upto`-th (all of them at the end)."""
            nonlocal sent
            if run.logprobs is None:
                return None
            upto = len(run.logprobs) if upto is None else upto
            new, sent = run.logprobs[sent:upto], upto
            return shape.logprobs(new, self.spec.piece)

        async with aclosing(ticking(stream, KEEPALIVE_SECONDS)) as items:  # closed with this: its wait too
            async for item in items:
                if item is None:
                    for event in shape.keepalive():
                        yield event
                    continue
                assert isinstance(item, Sent)
                first.append(time.perf_counter())
                text = calls.feed(item.piece.text) if calls else item.piece.text
                for event in shape.delta(text, logprobs(item.logprobs)):
                    yield event
        if run.logprobs is not None and sent < len(run.logprobs):  # tokens that made no text (a stop string)
            for event in shape.delta("", logprobs()):
                yield event
        if calls and (rest := calls.finish()[0]):
            for event in shape.delta(rest, None):
                yield event

    def _gone(self, request: Request, tokens: int) -> Response:
        """A client that left: nothing more runs for it; the log says so (499, as nginx counts it)."""
        self.say(f"localspec: {request.method} {request.url.path} 499 the client went away after {tokens} tokens")
        return Response(status_code=499)

    async def _events(
        self,
        request: Request,
        stream: Stream,
        run: Generation,
        shape: Shape,
        prompt_tokens: int,
        first: list[float],
        done: Callable[[], Served],
        watcher: asyncio.Task[None],
    ) -> AsyncIterator[bytes]:
        served: Served | None = None
        failed = False
        try:
            for event in shape.opening(prompt_tokens):
                yield event
            async with aclosing(self._deltas(stream, run, shape, first)) as deltas:
                async for event in deltas:
                    yield event
            served = done()
            for event in shape.closing(served):
                yield event
        except Stalled:  # told in the stream: an answer cut short must not read as a whole one
            failed = True
            error = ApiError(
                408,
                f"the answer was not read in time ({self.worker.stall_seconds:g} s in all, see --client-timeout): "
                "its generation stopped",
                code="stalled",
            )
            for event in shape.failure(error):
                yield event
        except ClientGone:
            pass
        except Exception:  # a failure after the stream started: an error event, then the end of the stream
            failed = True
            self.say(f"localspec: {request.method} {request.url.path} 500 failed mid-stream\n{traceback.format_exc()}")
            error = ApiError(500, "the generation failed (the server's log has the details)", kind="server_error")
            for event in shape.failure(error):
                yield event
        finally:
            watcher.cancel()
            with anyio.CancelScope(shield=True):  # a client that went away: stop the generation now
                await stream.aclose()
            if served is None and not failed:
                self.say(
                    f"localspec: {request.method} {request.url.path} 499 the client went away after "
                    f"{len(run.tokens)} tokens"
                )
