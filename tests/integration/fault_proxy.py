"""A small fault-injecting HTTP proxy for S3 tests: it sits in front of the moto server and, on a
fixed schedule, answers 503 SlowDown, answers 500 InternalError, resets the connection, or stalls
past the client's read timeout; requests a `body_stall` predicate picks are forwarded and answered
with the status, the headers and half the body, then stall mid-body (an endpoint that hangs while
streaming); every other request is forwarded unchanged. It can also add a
fixed latency per request and cap the bandwidth of all responses together (the benchmarks'
stand-in for a remote S3 region)."""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

SLOWDOWN = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate.</Message></Error>"
)
INTERNAL = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
    b"<Message>We encountered an internal error.</Message></Error>"
)


class FaultProxy:
    """`schedule` maps request number modulo `period` to a fault: 'slowdown', 'internal', 'reset', 'stall'."""

    def __init__(
        self,
        upstream: str,
        schedule: dict[int, str] | None = None,
        period: int = 10,
        stall_seconds: float = 3.0,
        latency_seconds: float = 0.0,
        bandwidth_bytes_per_second: float | None = None,
        body_stall: Callable[[str, str], bool] | None = None,
    ):
        self.upstream = urlsplit(upstream)
        self.schedule, self.period, self.stall_seconds = schedule or {}, period, stall_seconds
        self.latency, self.bandwidth, self.link_free_at = latency_seconds, bandwidth_bytes_per_second, 0.0
        self.count, self.faults, self.lock = 0, Counter(), threading.Lock()
        self.body_stall = body_stall  # (method, path with query) -> stall this one mid-body
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                with proxy.lock:
                    proxy.count += 1
                    fault = proxy.schedule.get(proxy.count % proxy.period)
                    if fault:
                        proxy.faults[fault] += 1
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if fault == "stall":
                    time.sleep(proxy.stall_seconds)  # the client has given up by now and retried
                    if proxy.closed:
                        return
                if fault in ("slowdown", "internal"):
                    payload = SLOWDOWN if fault == "slowdown" else INTERNAL
                    self.send_response(503 if fault == "slowdown" else 500)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if proxy.latency:
                    time.sleep(proxy.latency)
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "proxy-connection")}
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                if proxy.body_stall and proxy.body_stall(self.command, self.path):
                    with proxy.lock:
                        proxy.faults["body_stall"] += 1
                    self._stall_mid_body(response, data)
                    upstream.close()
                    return
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                # a HEAD answer has no body but reports the object's length
                self.send_header(
                    "Content-Length", response.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                )
                self.end_headers()
                if self.command != "HEAD":
                    proxy.send(self.wfile, data)
                upstream.close()

            def _stall_mid_body(self, response, data: bytes) -> None:
                """The status, the headers (an empty body announced as 64 bytes), half the body, then silence."""
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data) or 64))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                deadline = time.monotonic() + proxy.stall_seconds
                while time.monotonic() < deadline and not proxy.closed:
                    time.sleep(0.05)
                self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

            def log_message(self, *args):
                pass

        self.closed = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        # close() waits for serve_forever's next poll: 0.05 s, not its default 0.5 s
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def send(self, out, data: bytes, chunk: int = 256 << 10) -> None:
        """Write `data`, holding all connections together to `bandwidth` bytes per second."""
        if not self.bandwidth:
            out.write(data)
            return
        for start in range(0, len(data), chunk):
            piece = data[start : start + chunk]
            with self.lock:
                begin = max(time.monotonic(), self.link_free_at)
                self.link_free_at = begin + len(piece) / self.bandwidth
                done_at = self.link_free_at
            time.sleep(max(0.0, done_at - time.monotonic()))
            out.write(piece)

    def close(self) -> None:
        self.closed = True
        self.server.shutdown()
