"""A tiny OpenAI-shaped streaming server for testing the harness itself.

It answers ``/v1/chat/completions`` and ``/v1/completions`` with ``max_tokens`` SSE chunks
(one word each, ``chunk_delay_s`` apart) and a usage chunk, ``/v1/models``, and a
``/metrics`` page with vLLM-named counters. Plain asyncio, no framework: it must cost far
less CPU per request than the client under test. A request whose ``model`` is
``"fail-<code>"`` gets that HTTP status, so error handling can be tested.

A server of known capacity. With ``max_concurrency`` C, at most C requests generate at once;
the others wait in a first-come queue (``vllm:num_requests_waiting``; the generating ones are
``vllm:num_requests_running`` and ``vllm:kv_cache_usage_perc`` is running / C). Token i of a
request is due ``first_token_delay_s + i * chunk_delay_s`` after it got its slot (deadlines,
not chained sleeps, so timer overshoot does not add up), so a request of L tokens holds a slot
for S(L) = first_token_delay_s + (L - 1) * chunk_delay_s and the server completes at most
C / S(L) requests per second: ``capacity(L)``.

    python -m workshop.bench.mock_server --port 8199
"""

from __future__ import annotations

import argparse
import asyncio
import json

from reference_server import prometheus as P


class MockServer:
    def __init__(self, chunk_delay_s: float = 0.0, first_token_delay_s: float = 0.0,
                 max_concurrency: int | None = None):
        self.chunk_delay_s = chunk_delay_s
        self.first_token_delay_s = first_token_delay_s
        self.max_concurrency = max_concurrency
        self.requests = 0
        self.cache_resets = 0
        self.prompt_tokens = 0
        self.running = 0
        self.waiting = 0
        self._slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.server: asyncio.base_events.Server | None = None

    def service_time(self, output_tokens: int) -> float:
        """Seconds a request of ``output_tokens`` holds a slot (from slot to last token)."""
        return self.first_token_delay_s + max(output_tokens - 1, 0) * self.chunk_delay_s

    def capacity(self, output_tokens: int) -> float | None:
        """Requests/s the server sustains when every request asks for ``output_tokens``
        (None: no concurrency limit, so no finite capacity)."""
        if not self.max_concurrency:
            return None
        return self.max_concurrency / self.service_time(output_tokens)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self.server = await asyncio.start_server(self._conn, host, port, backlog=1024)
        return self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _,
                           v in (line.partition(":") for line in lines[1:] if line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                await self._handle(method, path, body, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _simple(writer: asyncio.StreamWriter, status: int, body: bytes,
                ctype: str = "application/json") -> None:
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: "
                     f"{len(body)}\r\n"
                     "Connection: keep-alive\r\n\r\n".encode() + body)

    async def _handle(self, method: str, path: str, body: bytes,
                      writer: asyncio.StreamWriter) -> None:
        if method == "GET" and path == "/v1/models":
            self._simple(writer, 200,
                         b'{"object":"list","data":[{"id":"mock","object":"model","owned_by":"mock"}]}')
            return
        if method == "GET" and path == "/health":
            self._simple(writer, 200, b"{}")
            return
        # as vLLM's: the harness empties it per run
        if method == "POST" and path == "/reset_prefix_cache":
            self.cache_resets += 1
            self._simple(writer, 200, b'{"success": true}')
            return
        if method == "GET" and path == "/metrics":
            m = '{model_name="mock"}'
            text = (f"# TYPE {P.PREFIX_CACHE_QUERIES} counter\n"
                    f"{P.PREFIX_CACHE_QUERIES}{m} {float(self.prompt_tokens)}\n"
                    f"{P.PREFIX_CACHE_HITS}{m} {float(self.prompt_tokens // 2)}\n"
                    f"{P.KV_CACHE_USAGE}{m} {self._kv_usage()}\n"
                    f"{P.NUM_PREEMPTIONS}{m} 0.0\n"
                    f"{P.NUM_REQUESTS_RUNNING}{m} {float(self.running)}\n"
                    f"{P.NUM_REQUESTS_WAITING}{m} {float(self.waiting)}\n")
            self._simple(writer, 200, text.encode(), "text/plain")
            return
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            self._simple(writer, 404, b'{"error":{"message":"not found"}}')
            return
        req = json.loads(body)
        model = str(req.get("model", ""))
        if model.startswith("fail-"):
            self._simple(writer, int(model[5:]),
                         b'{"error":{"message":"asked to fail","type":"mock"}}')
            return
        self.requests += 1
        n = int(req.get("max_tokens") or 16)
        chat = path.endswith("chat/completions")
        prompt = json.dumps(req.get("messages") if chat else req.get("prompt"))
        n_prompt = len(prompt.split())
        self.prompt_tokens += n_prompt
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
                     b"chunked\r\nConnection: keep-alive\r\n\r\n")

        def event(obj: object) -> None:
            data = (b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
                    + b"\n\n")
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        if self._slots is not None:
            self.waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self.waiting -= 1
        self.running += 1
        try:
            await self._generate(n, n_prompt, chat, writer, event)
        finally:
            self.running -= 1
            if self._slots is not None:
                self._slots.release()

    def _kv_usage(self) -> float:
        return self.running / self.max_concurrency if self.max_concurrency else 0.25

    async def _generate(self, n: int, n_prompt: int, chat: bool, writer: asyncio.StreamWriter,
                        event) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(n):
            due = start + self.first_token_delay_s + i * self.chunk_delay_s
            if due > loop.time():
                if i:
                    await writer.drain()
                await asyncio.sleep(due - loop.time())
            choice = ({"index": 0, "delta": {"content": f" w{i}"}} if chat
                      else {"index": 0, "text": f" w{i}"})
            event({"id": "x", "object": "chunk", "choices": [choice]})
        event({"id": "x", "object": "chunk", "choices": [],
               "usage": {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt
                         + n,
                         "prompt_tokens_details": {"cached_tokens": n_prompt // 2}}})
        event(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8199)
    ap.add_argument("--chunk-delay-s", type=float, default=0.0, help="gap between token chunks")
    ap.add_argument("--first-token-delay-s", type=float, default=0.0,
                    help="wait before the first chunk")
    ap.add_argument("--max-concurrency", type=int,
                    help="requests generating at once; the rest wait in a queue")
    args = ap.parse_args()

    async def serve() -> None:
        s = MockServer(args.chunk_delay_s, args.first_token_delay_s, args.max_concurrency)
        port = await s.start(args.host, args.port)
        print(f"mock server on http://{args.host}:{port}", flush=True)
        await s.server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
