"""An HTTP proxy of the tests' own between an S3 client (s3fs) and an S3 server (moto's), that misbehaves on purpose.

Point the client at it (`AWS_ENDPOINT_URL=proxy.url`) and it forwards every request to the server, except that a
chosen share of them is answered the way a struggling object store answers: `503 SlowDown` with S3's XML error
body, a connection reset (an RST, no answer), or a stall (the request is read, then nothing comes back for
`stall_seconds`, then the connection closes). Which requests: a share (`rate`, drawn from a seeded generator so a
run can be repeated), optionally only some methods (`methods`, e.g. {"PUT", "POST"}) and only paths holding one of
`paths` (substrings). Every request is counted by method (`counts`), so a test can also tell how many requests a
save costs.

    with FaultProxy(server_url) as proxy:
        proxy.set(fault="503", rate=0.3)
        ...
        proxy.set(fault=None)

Another process (a launched worker) sets the faults with `set_faults(proxy_url, fault=..., rate=...)`, a request to
the proxy's own path `/__proxy__/set`, which is never forwarded.

Stdlib only, one thread per client connection (s3fs keeps a pool of keep-alive connections).
"""

from __future__ import annotations

import collections
import http.client
import http.server
import random
import socket
import struct
import threading
import urllib.parse

FAULTS = ("503", "reset", "stall", "403")
CONTROL_PATH = "/__proxy__/set"
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
               "content-length"}
_ERRORS = {
    "503": (503, "SlowDown", "Please reduce your request rate."),
    "403": (403, "AccessDenied", "Access Denied"),
}


class FaultProxy:
    def __init__(self, upstream: str, seed: int = 0):
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname, parsed.port)
        self.counts: collections.Counter = collections.Counter()  # requests seen, by method
        self.faulted: collections.Counter = collections.Counter()  # faults served, by kind
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._release = threading.Event()  # set to end every stall at once (at shutdown)
        self.set(fault=None)
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def set(self, fault=None, rate: float = 1.0, methods=None, paths=None, stall_seconds: float = 30.0) -> None:
        """Serve `fault` (one of FAULTS, or None for none) to a share `rate` of the requests whose method is in
        `methods` (all when None) and whose path holds one of `paths` (all when None)."""
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"fault={fault!r}: use one of {FAULTS} or None")
        with self._lock:
            self.fault, self.rate, self.stall_seconds = fault, float(rate), float(stall_seconds)
            self.methods = None if methods is None else {m.upper() for m in methods}
            self.paths = None if paths is None else tuple(paths)

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()
            self.faulted.clear()

    def _choose(self, method: str, path: str):
        """The fault to serve this request, or None; counts it."""
        with self._lock:
            self.counts[method] += 1
            if self.fault is None:
                return None
            if self.methods is not None and method not in self.methods:
                return None
            if self.paths is not None and not any(p in urllib.parse.unquote(path) for p in self.paths):
                return None
            if self._random.random() >= self.rate:
                return None
            self.faulted[self.fault] += 1
            return self.fault

    def start(self) -> "FaultProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _handler_for(proxy: FaultProxy):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, and `Expect: 100-continue` answered as a server does
        _upstream = None

        def log_message(self, *args):  # quiet
            pass

        def _body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                data = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                            pass
                        return bytes(data)
                    data += self.rfile.read(size)
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _forward(self, body: bytes):
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP | {"expect"}}
            headers["Content-Length"] = str(len(body))
            for attempt in (1, 2):  # a kept-alive upstream connection the server closed meanwhile: once more
                if self._upstream is None:
                    self._upstream = http.client.HTTPConnection(*proxy.upstream, timeout=120)
                try:
                    self._upstream.request(self.command, self.path, body=body, headers=headers)
                    response = self._upstream.getresponse()
                    return response, response.read()
                except (http.client.HTTPException, OSError):
                    self._upstream.close()
                    self._upstream = None
                    if attempt == 2:
                        raise

        def _error(self, status: int, code: str, message: str):
            xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
                   f"<Resource>{self.path}</Resource><RequestId>hasten-fault-proxy</RequestId></Error>").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(xml)

        def _reset(self):
            # SO_LINGER with a zero timeout: close() sends an RST, as a dropped connection looks to the client
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True

        def _control(self):
            """`GET /__proxy__/set?fault=503&rate=0.3&methods=PUT,POST&paths=checkpoint_2/`: set the faults from
            another process (a launched worker), answered 200."""
            query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
            split = (lambda v: v.split(",") if v else None)
            proxy.set(fault=query.get("fault") or None, rate=float(query.get("rate", 1.0)),
                      methods=split(query.get("methods")), paths=split(query.get("paths")),
                      stall_seconds=float(query.get("stall_seconds", 30.0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _serve(self):
            if self.path.startswith(CONTROL_PATH):
                return self._control()
            fault = proxy._choose(self.command, self.path)
            body = self._body()
            if fault == "reset":
                return self._reset()
            if fault == "stall":
                proxy._release.wait(proxy.stall_seconds)
                self.close_connection = True
                return None
            if fault in _ERRORS:
                return self._error(*_ERRORS[fault])
            try:
                response, payload = self._forward(body)
            except OSError:
                return self._error(502, "BadGateway", "the proxy could not reach the server")
            self.send_response_only(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in _HOP_BY_HOP:
                    self.send_header(key, value)
            length = response.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            return None

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

        def finish(self):
            super().finish()
            if self._upstream is not None:
                self._upstream.close()

    return Handler


def set_faults(proxy_url: str, **fields) -> None:
    """Set a running proxy's faults from another process (`fields` as `FaultProxy.set`; lists comma-joined)."""
    import urllib.request

    query = urllib.parse.urlencode({k: ",".join(v) if isinstance(v, (list, tuple, set)) else ("" if v is None else v)
                                    for k, v in fields.items()})
    urllib.request.urlopen(f"{proxy_url}{CONTROL_PATH}?{query}", timeout=30).read()
