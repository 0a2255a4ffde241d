#!/usr/bin/env python3
"""A small OpenAI-compatible streaming server that is awkward about keep-alive, for testing the
braid-bench HTTP client (tests/integration/test_bench_client.sh). Standard library only.

    fake_openai_server.py --port P [--mode MODE] [--framing chunked|length|eof] [--tokens N]
                          [--token-delay-ms D] [--workflow-end 200|404|405] [--stats FILE] [--ready FILE]

POST /v1/completions and /v1/chat/completions answer 200 with an SSE stream of N one-token
chunks ("tok "), a usage chunk (prompt_tokens = words of the prompt) and "data: [DONE]".
POST /v1/workflows/{id}/end answers --workflow-end. GET /stats answers the counters as JSON;
GET /health and /v1/models answer as a server does (for tools that probe first).

Modes (how connections are closed; none of them sends a wrong answer to a request it answers):
  keep             HTTP/1.1 keep-alive, connections stay open (the polite server)
  close-after-N    close the connection right after its N-th response, without saying so
  close-after      close right after every response, without a "Connection: close" header
  idle-close       close a connection that has been idle for 20 ms
  drop-next        answer the first request of a connection; read the next one on it, then close
                   without a byte of answer (an idle timeout racing a request: safe to resend)
  connection-close send "Connection: close" and close after every response
  partial          send the headers and the first chunk, then close (never safe to resend)
Framing: chunked (Transfer-Encoding), length (Content-Length, the whole body at once) or eof
(neither: the body ends when the connection closes; implies closing after the response).
The counters (requests read, answered, dropped, connections) go to --stats on SIGTERM/exit too.
"""
import argparse
import json
import re
import signal
import socket
import socketserver
import sys
import threading
import time


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.values = {"connections": 0, "requests": 0, "answered": 0, "dropped": 0, "partial": 0,
                       "workflow_ends": 0}

    def add(self, key, n=1):
        with self.lock:
            self.values[key] += n

    def snapshot(self):
        with self.lock:
            return dict(self.values)


def read_request(rfile):
    """Returns (method, path, headers, body) or None when the peer closed before a request."""
    line = rfile.readline(65536)
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) < 2:
        return None
    headers = {}
    while True:
        h = rfile.readline(65536)
        if not h or h in (b"\r\n", b"\n"):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0") or 0)
    body = rfile.read(n) if n else b""
    return parts[0], parts[1], headers, body


def sse_events(body, tokens):
    try:
        req = json.loads(body or b"{}")
    except ValueError:
        req = {}
    chat = "messages" in req
    prompt = req.get("prompt") if not chat else " ".join(str(m.get("content", "")) for m in req.get("messages", []))
    prompt_tokens = max(1, len(str(prompt or "").split()))
    n = min(tokens, int(req.get("max_tokens", tokens) or tokens))
    events = []
    for i in range(n):
        choice = {"index": 0, "finish_reason": "length" if i == n - 1 else None}
        if chat:
            choice["delta"] = {"content": "tok "}
        else:
            choice["text"] = "tok "
        events.append({"id": "x", "object": "chunk", "choices": [choice]})
    events.append({"id": "x", "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                                        "total_tokens": prompt_tokens + n,
                                                        "prompt_tokens_details": {"cached_tokens": 0}}})
    return [("data: " + json.dumps(e) + "\n\n").encode() for e in events] + [b"data: [DONE]\n\n"]


class Handler(socketserver.StreamRequestHandler):
    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle(self):
        cfg, counters = self.server.cfg, self.server.counters
        counters.add("connections")
        served = 0
        while True:
            if cfg.mode == "idle-close" and served > 0:
                self.connection.settimeout(0.02)
            try:
                req = read_request(self.rfile)
            except (socket.timeout, OSError):
                return  # idle too long: close
            self.connection.settimeout(None)
            if req is None:
                return
            method, path, headers, body = req
            counters.add("requests")
            if cfg.mode == "drop-next" and served > 0:
                counters.add("dropped")
                return  # read, never answered: the client got no byte
            keep = self.answer(method, path, body, served)
            served += 1
            if not keep:
                return
            if cfg.mode == "close-after" or (cfg.mode.startswith("close-after-") and served >= int(cfg.mode.rsplit("-", 1)[1])):
                return

    def send(self, data):
        self.wfile.write(data)
        self.wfile.flush()

    def answer(self, method, path, body, served):
        """Writes one response; returns whether the connection may stay open."""
        cfg, counters = self.server.cfg, self.server.counters
        close_hdr = cfg.mode == "connection-close"
        if method == "GET" and path == "/stats":
            return self.plain(200, json.dumps(counters.snapshot()).encode(), close_hdr)
        if method == "GET" and path == "/health":
            return self.plain(200, b'{"status":"ok"}', close_hdr)
        if method == "GET" and path == "/v1/models":
            return self.plain(200, b'{"object":"list","data":[{"id":"fake","object":"model"}]}', close_hdr)
        m = re.fullmatch(r"/v1/workflows/[^/]+/end", path)
        if method == "POST" and m:
            counters.add("workflow_ends")
            status = cfg.workflow_end
            payload = b'{"ok":true}' if status == 200 else b'{"error":{"message":"no such endpoint"}}'
            return self.plain(status, payload, close_hdr)
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            return self.plain(404, b'{"error":{"message":"not found"}}', close_hdr)
        events = sse_events(body, cfg.tokens)
        head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        if close_hdr or cfg.framing == "eof":
            head += "Connection: close\r\n" if close_hdr else ""
        if cfg.mode == "partial":
            self.send((head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"%x\r\n%s\r\n" % (len(events[0]), events[0]))
            counters.add("partial")
            return False
        delay = cfg.token_delay_ms / 1000.0
        if cfg.framing == "length":
            if delay:
                time.sleep(delay * len(events))
            data = b"".join(events)
            self.send((head + "Content-Length: %d\r\n\r\n" % len(data)).encode() + data)
        elif cfg.framing == "chunked":
            self.send((head + "Transfer-Encoding: chunked\r\n\r\n").encode())
            for e in events:
                if delay:
                    time.sleep(delay)
                self.send(b"%x\r\n%s\r\n" % (len(e), e))
            self.send(b"0\r\n\r\n")
        else:  # eof: the body ends when the connection closes
            self.send((head + "\r\n").encode())
            for e in events:
                if delay:
                    time.sleep(delay)
                self.send(e)
        counters.add("answered")
        return not close_hdr and cfg.framing != "eof"

    def plain(self, status, payload, close_hdr):
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}.get(status, "Status")
        head = "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (status, reason, len(payload))
        if close_hdr:
            head += "Connection: close\r\n"
        self.send((head + "\r\n").encode() + payload)
        return not close_hdr


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="keep")
    ap.add_argument("--framing", choices=["chunked", "length", "eof"], default="chunked")
    ap.add_argument("--tokens", type=int, default=5)
    ap.add_argument("--token-delay-ms", type=float, default=0.0)
    ap.add_argument("--workflow-end", type=int, default=200)
    ap.add_argument("--stats", default="")
    ap.add_argument("--ready", default="", help="a file written once the port is bound")
    cfg = ap.parse_args()
    srv = Server(("127.0.0.1", cfg.port), Handler)
    srv.cfg, srv.counters = cfg, Counters()
    if cfg.ready:
        with open(cfg.ready, "w") as f:
            f.write("%d\n" % cfg.port)

    def stop(*_):
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        srv.serve_forever(poll_interval=0.05)
    finally:
        if cfg.stats:
            with open(cfg.stats, "w") as f:
                json.dump(srv.counters.snapshot(), f)
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
