"""A minimal streaming HTTP harness around onnxruntime-genai's `og.Engine` (runs in .venv-tools).

  .venv-tools/bin/python bench/peers/genai_engine_http.py --model-dir DIR [--threads 2]
      [--max-batch 16] [--port 0]

This is NOT a server onnxruntime-genai ships: genai 0.18 has no HTTP front end.
It is the least code that lets the load generator (bench/served/load.py) send the
same OpenAI `/v1/completions` streaming requests to genai's Engine that it sends
to ortserve and llama-server: a stdlib ThreadingHTTPServer, one engine thread that
owns the Engine (`create_request`, `begin_turn` with TurnOptions, `run` over an
event buffer) and hands each TOKEN / TURN_FINISHED / FAILED event to its request's
queue, and per request an SSE writer that decodes tokens with a TokenizerStream.
It honours what the load generator sends: `prompt` (text or token ids),
`max_tokens`, `ignore_eos` (genai's min_generated_tokens = max_tokens),
`temperature` 0 (greedy) and `stream_options.include_usage`; anything it cannot
honour is a 400 naming the field. Streaming only.

On this CPU the builder's model has no paged KV (GQA over a static cache), so the
Engine runs its static batch scheduler: up to `--max-batch` requests
(genai_config's `engine.static_batching.max_batch_size`) start together and later
ones wait until that whole batch has ended. That is the peer's behaviour, measured
as it is. stdout: one JSON line `{"listening": "127.0.0.1:PORT", ...}` once
ready; notices on stderr.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import onnxruntime_genai as og

# run as a script beside genai_peer.py (its folder is sys.path[0]), as genai_peer.py is
from genai_peer import model_with_threads

MODEL_NAME = "genai-engine"


def model_folder(model_dir: Path, threads: int, max_batch: int, max_length: int) -> Path:
    """genai_peer's folder of symlinks (its threads), whose genai_config also sets the static
    batch and the longest request (the static cache holds max_batch x max_length tokens)."""
    out = model_with_threads(model_dir, threads)
    config = json.loads((out / "genai_config.json").read_text())
    config["search"]["max_length"] = min(max_length, config["search"].get("max_length", max_length))
    config["engine"] = {"static_batching": {"max_batch_size": max_batch}}
    (out / "genai_config.json").write_text(json.dumps(config))
    return out


class EngineLoop:
    """The one thread that touches the Engine: submissions and cancellations come in on a
    queue, events go out on each request's own queue."""

    def __init__(self, model: og.Model, max_length: int):
        self.max_length = max_length
        self.inbox: queue.Queue = queue.Queue()
        self.live: dict[int, tuple[og.Request, queue.Queue]] = {}
        self.max_batch_size = 0
        ready = threading.Event()
        threading.Thread(target=self._loop, args=(model, ready), name="engine", daemon=True).start()
        ready.wait()

    def submit(self, ids: np.ndarray, max_tokens: int, min_tokens: int) -> queue.Queue:
        out: queue.Queue = queue.Queue()
        self.inbox.put(("submit", ids, max_tokens, min_tokens, out))
        return out

    def cancel(self, out: queue.Queue) -> None:
        self.inbox.put(("cancel", out))

    def _take(self, block: bool) -> None:
        while True:
            try:
                cmd = self.inbox.get(block=block)
            except queue.Empty:
                return
            block = False
            if cmd[0] == "submit":
                _, ids, max_tokens, min_tokens, out = cmd
                request = self.engine.create_request()
                options = og.TurnOptions(request)
                options.set_max_generated_tokens(max_tokens)
                if min_tokens:
                    options.set_min_generated_tokens(min_tokens)
                options.set_do_sample(False)
                try:
                    request.begin_turn(ids, options)
                except Exception as exc:  # reported to the handler, never kills the loop
                    out.put(("error", f"{type(exc).__name__}: {exc}"))
                    continue
                self.live[id(request)] = (request, out)
            else:
                for key, (request, out) in list(self.live.items()):
                    if out is cmd[1]:
                        request.close()
                        del self.live[key]

    def _loop(self, model: og.Model, ready: threading.Event) -> None:
        # NOTE: the Engine refuses calls from any thread but the one that made it.
        self.engine = og.Engine(model)
        self.buffer = self.engine.create_event_buffer(256)
        self.max_batch_size = self.engine.get_capabilities().configured_max_batch_size
        ready.set()
        while True:
            self._take(block=not self.engine.has_pending_requests())
            if not self.engine.has_pending_requests():
                continue
            for event in self.engine.run(self.buffer):
                entry = self.live.get(id(event.request))
                if entry is None:
                    continue
                flags = int(event.flags.value)
                if flags & int(og.EngineEventFlags.TOKEN.value):
                    entry[1].put(("token", int(event.token)))
                if flags & int(og.EngineEventFlags.FAILED.value):
                    entry[1].put(("error", f"engine {event.error_code.name}"))
                    self.live.pop(id(event.request), None)
                elif flags & int(og.EngineEventFlags.TURN_FINISHED.value):
                    u = event.usage
                    entry[1].put(("end", event.finish_reason.name, u.prompt_tokens,
                                  u.generated_tokens, u.cached_prompt_tokens))
                    self.live.pop(id(event.request), None)


class BadRequest(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def parse(body: dict, tokenizer: og.Tokenizer, max_length: int) -> tuple[np.ndarray, int, int]:
    """The prompt's ids, max_tokens and min_tokens, or BadRequest naming the field."""
    if body.get("stream") is not True:
        raise BadRequest("stream", "this harness streams only: send stream: true")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = np.array(tokenizer.encode(prompt), dtype=np.int32)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        ids = np.array(prompt, dtype=np.int32)
    else:
        raise BadRequest("prompt", "must be a string or a non-empty list of token ids")
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest("max_tokens", "must be an integer >= 1")
    if len(ids) + max_tokens > max_length:
        raise BadRequest("max_tokens", f"prompt {len(ids)} + max_tokens {max_tokens} tokens is "
                                       f"more than this harness's max_length {max_length}")
    if body.get("temperature", 1.0) != 0:
        raise BadRequest("temperature", "only 0 (greedy) is honoured here")
    return ids, max_tokens, max_tokens if body.get("ignore_eos") else 0


def make_handler(loop: EngineLoop, tokenizer: og.Tokenizer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # no line per request on stderr
            pass

        def _json(self, status: int, doc: dict) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}", "code": "not_found"}})

        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                self._json(404, {"error": {"message": f"no route {self.path}", "code": "not_found"}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                ids, max_tokens, min_tokens = parse(body, tokenizer, loop.max_length)
            except BadRequest as exc:
                self._json(400, {"error": {"message": str(exc), "param": exc.param,
                                           "code": "invalid_parameter"}})
                return
            except ValueError as exc:
                self._json(400, {"error": {"message": f"body is not JSON: {exc}", "code": "invalid_json"}})
                return
            out = loop.submit(ids, max_tokens, min_tokens)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            stream = tokenizer.create_stream()
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            try:
                while True:
                    event = out.get()
                    if event[0] == "token":
                        self._sse({"object": "text_completion", "model": MODEL_NAME, "choices": [
                            {"index": 0, "text": stream.decode(event[1]), "finish_reason": None}]})
                    elif event[0] == "error":
                        self._sse({"error": {"message": event[1], "code": "engine_error"}})
                        break
                    else:
                        _, reason, prompt_tokens, generated, cached = event
                        finish = "length" if reason == "MAX_GENERATED_TOKENS" else "stop"
                        self._sse({"object": "text_completion", "model": MODEL_NAME, "choices": [
                            {"index": 0, "text": "", "finish_reason": finish}]})
                        if usage:
                            self._sse({"object": "text_completion", "model": MODEL_NAME, "choices": [],
                                       "usage": {"prompt_tokens": prompt_tokens,
                                                 "completion_tokens": generated,
                                                 "total_tokens": prompt_tokens + generated,
                                                 "prompt_tokens_details": {"cached_tokens": cached}}})
                        break
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except OSError:  # the client went away: end its request in the engine
                loop.cancel(out)

        def _sse(self, doc: dict) -> None:
            self.wfile.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
            self.wfile.flush()

    return Handler


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-batch", type=int, default=16, help="engine.static_batching.max_batch_size")
    p.add_argument("--max-length", type=int, default=4096,
                   help="the longest request, prompt + output (search.max_length)")
    p.add_argument("--port", type=int, default=0)
    a = p.parse_args()
    model = og.Model(og.Config(str(model_folder(a.model_dir, a.threads, a.max_batch, a.max_length))))
    tokenizer = og.Tokenizer(model)
    loop = EngineLoop(model, a.max_length)
    # NOTE: the default listen backlog (5) resets connections under an open loop's bursts.
    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer(("127.0.0.1", a.port), make_handler(loop, tokenizer))
    server.daemon_threads = True
    print(json.dumps({"listening": f"127.0.0.1:{server.server_address[1]}",
                      "genai_version": og.__version__,
                      "max_batch_size": loop.max_batch_size,
                      "max_length": a.max_length, "started": time.time()}), flush=True)
    print(f"genai-engine-http: serving {a.model_dir.name} on 127.0.0.1:{server.server_address[1]}",
          file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
