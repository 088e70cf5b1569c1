"""`gates dashboard`: the pages over HTTP (stdlib ThreadingHTTPServer), read-only: GET and HEAD only.

One daemon thread per connection, a listen backlog of REQUEST_QUEUE_SIZE (the stdlib's 5 made a burst
of clients wait for SYN retransmits), a client that goes away is one log line, and a request whose Host
header is not an address this server answers to is refused with 421 (DNS rebinding: a page on another
site must not read the dashboard through a name that resolves to 127.0.0.1).

What one client can hold is bounded (issue #28: 3,000 clients sending a byte every 5 s held 3,000
threads). Each read and write waits at most READ_TIMEOUT; the whole request (line, headers) must arrive
within REQUEST_DEADLINE of its start and the whole answer be taken within ANSWER_DEADLINE of its first
byte, however slowly either drips, else the connection is closed and logged in one line (a request
body is never waited for: the server speaks HTTP/1.0 and closes after each answer). At most
MAX_CONNECTIONS_PER_CLIENT connections per client address and MAX_CONNECTIONS in all are open; one
more is answered 503 with Retry-After and closed by the accepting thread, without a thread of its own.
The limits are Server attributes, so a test sets them small on its instance.
"""

from __future__ import annotations

import io
import ipaddress
import math
import os
import sys
import threading
import time
import traceback
from collections import Counter
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from gates.dashboard import render
from gates.dashboard.site import Site
from gates.errors import UserError

READ_TIMEOUT = 10.0  # seconds one read or write of a connection may wait
REQUEST_DEADLINE = 10.0  # seconds from a request's start until its last header has arrived
ANSWER_DEADLINE = 30.0  # seconds from an answer's first byte until the client has taken it all
# a browser opens 6 per host; the per-client cap stays above a burst of 200 from one address (the
# load test), and both caps bound threads (each mostly its stack) well below what a process can hold
MAX_CONNECTIONS_PER_CLIENT = 256
MAX_CONNECTIONS = 512
REQUEST_QUEUE_SIZE = 1024  # listen backlog (the kernel caps it at net.core.somaxconn)
CONNECTION_GONE = (
    ConnectionError,
    TimeoutError,
)  # BrokenPipeError, ConnectionResetError, ...; a timeout


class DeadlineStream(io.RawIOBase):
    """A connection's socket as a file whose reads share one deadline per request and whose writes
    share one per answer: a fresh timeout per call let a client that sends (or takes) a byte now and
    then hold its thread forever."""

    def __init__(self, sock, read_timeout: float):
        self.sock, self.read_timeout = sock, read_timeout
        self.start(math.inf, math.inf)

    def start(self, request_s: float, answer_s: float) -> None:
        """A new request: it must arrive within request_s from now, its answer within answer_s of
        the answer's first byte."""
        self.request_s, self.answer_s = request_s, answer_s
        self.read_by, self.write_by = time.monotonic() + request_s, None

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        return self._within(self.read_by, "request", self.request_s, self.sock.recv_into, b)

    def write(self, b) -> int:
        if self.write_by is None:
            self.write_by = time.monotonic() + self.answer_s
        self._within(self.write_by, "answer", self.answer_s, self.sock.sendall, b)
        return len(b)

    def _within(self, deadline: float, what: str, seconds: float, call, data):
        left = deadline - time.monotonic()
        if left > 0:
            self.sock.settimeout(min(left, self.read_timeout))
            try:
                return call(data)
            except TimeoutError:
                if time.monotonic() < deadline:
                    raise  # the per-call timeout, not the deadline
        raise TimeoutError(f"{what} deadline of {seconds:g} s passed")


class Handler(BaseHTTPRequestHandler):
    site: Site  # set on the subclass made by make_server
    server_version = "gates-dashboard"
    timeout = READ_TIMEOUT  # DeadlineStream's limit on each read and write

    def setup(self):  # StreamRequestHandler's, with files that keep the deadlines
        self.connection = self.request
        self.stream = DeadlineStream(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self.stream)
        self.wfile = self.stream

    def handle_one_request(self):  # deadlines per request, should the server ever keep connections
        self.stream.start(self.server.request_deadline, self.server.answer_deadline)
        super().handle_one_request()

    def handle(self):
        try:
            super().handle()
        except (
            CONNECTION_GONE
        ) as err:  # the client went away mid-request or mid-answer: one line, no traceback
            self.close_connection = True
            self.log_message("connection closed by the client (%s)", type(err).__name__)

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        hosts = self.headers.get_all("Host") or []
        if len(hosts) > 1 or (hosts and not self.server.host_allowed(hosts[0])):
            self.close_connection = True
            self._send(
                HTTPStatus.MISDIRECTED_REQUEST,
                f"<h1>421: this dashboard answers to {render.e(self.server.url_host)} only</h1>",
                self.command != "HEAD",
            )
            return False
        return True

    def do_GET(self):
        self._respond(send_body=True)

    def do_HEAD(self):
        self._respond(send_body=False)

    def __getattr__(self, name):  # every other method (POST, PUT, DELETE, made-up ones): 405
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self):
        self._send(
            HTTPStatus.METHOD_NOT_ALLOWED,
            "<h1>405: the dashboard is read-only (GET and HEAD)</h1>",
            True,
            {"Allow": "GET, HEAD"},
        )

    def _respond(self, send_body: bool):
        path = unquote(urlsplit(self.path).path)
        try:
            if path in ("/", "/index.html"):
                status, html = HTTPStatus.OK, self.site.index(query=urlsplit(self.path).query)
            elif path.startswith("/contract/"):
                contract_id = path[len("/contract/") :].removesuffix(".html")
                html = self.site.contract(contract_id)
                status = HTTPStatus.OK
                if html is None:
                    status, html = (
                        HTTPStatus.NOT_FOUND,
                        self.site.not_found(f"no contract {contract_id!r}"),
                    )
            else:
                status, html = HTTPStatus.NOT_FOUND, self.site.not_found(f"no page {path!r}")
        except (
            Exception
        ) as err:  # the server keeps serving; the page says what failed, the log says where
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            self.log_message(
                "error rendering %s: %s", path, traceback.format_exc().strip().replace("\n", " | ")
            )
            html = render.page(
                "Error",
                f"<h1>500</h1><p>This page could not be rendered: "
                f"{render.e(type(err).__name__)}: {render.e(str(err)[:300])}. The server's "
                f"log has the details.</p>",
                render.SERVER,
                "",
            )
        self._send(status, html, send_body)

    def _send(self, status: HTTPStatus, html: str, send_body: bool, extra: dict | None = None):
        body = html.encode("utf-8")
        self.send_response(status)
        headers = {
            "Content-Type": "text/html; charset=utf-8",
            "Content-Length": str(len(body)),
            "Cache-Control": "no-store",
            "Content-Security-Policy": render.CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            **(extra or {}),
        }
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(
        self, format, *args
    ):  # one short line per request on stderr, control characters escaped
        message = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in format % args)
        sys.stderr.write(f"{self.address_string()} {message}\n")


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a hanging connection never keeps the process alive
    request_queue_size = REQUEST_QUEUE_SIZE
    request_deadline = REQUEST_DEADLINE
    answer_deadline = ANSWER_DEADLINE
    max_connections_per_client = MAX_CONNECTIONS_PER_CLIENT
    max_connections = MAX_CONNECTIONS

    def __init__(self, address, handler, *, host_names: tuple[str, ...] = ()):
        super().__init__(address, handler)
        host, port = self.server_address[:2]
        self.wildcard = host in ("0.0.0.0", "::", "")
        self.host_names = {
            "127.0.0.1",
            "localhost",
            "::1",
            str(host).lower(),
            *(h.lower() for h in host_names if h),
        }
        self.url_host = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
        self.open_lock = threading.Lock()
        self.open_connections = 0
        self.open_per_client: Counter[str] = Counter()

    def process_request(self, request, client_address):
        """A thread for the connection, or at once a 503 if its address or the server is at its cap."""
        client = client_address[0]
        with self.open_lock:
            if self.open_per_client[client] >= self.max_connections_per_client:
                refusal = f"{self.open_per_client[client]} connections open from this address"
            elif self.open_connections >= self.max_connections:
                refusal = f"{self.open_connections} connections open"
            else:
                refusal = None
                self.open_connections += 1
                self.open_per_client[client] += 1
        if refusal:
            self.refuse(request, client, refusal)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.release(client)  # no thread started ("can't start new thread") to free the slot
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.release(client_address[0])

    def release(self, client: str) -> None:
        with self.open_lock:
            self.open_connections -= 1
            self.open_per_client[client] -= 1
            if self.open_per_client[client] <= 0:  # a flood from many addresses leaves no keys
                del self.open_per_client[client]

    def refuse(self, request, client: str, reason: str) -> None:
        """503 and close, on the accepting thread, so without blocking: a client that reads nothing
        must not stall the accept loop."""
        sys.stderr.write(f"{client} refused with 503: {reason}\n")
        body = b"503: the dashboard has too many connections open; retry shortly\n"
        head = (
            f"HTTP/1.1 503 Service Unavailable\r\nRetry-After: {math.ceil(self.request_deadline)}\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n"
        )  # Retry-After: by then each connection holding a slot has sent its request or been closed
        try:
            request.setblocking(False)
            request.send(head.encode() + body)  # a fresh socket's send buffer holds it whole
            # what the client already sent: closed unread, it would reset the connection and could
            # cost the client the 503
            request.recv(65536)
        except OSError:
            pass
        self.shutdown_request(request)

    def host_allowed(self, value: str) -> bool:
        """Whether a request's Host header names this server: a loopback name or the bound (or given)
        host, with the bound port. Bound to every address, any IP literal is accepted (rebinding needs
        a DNS name)."""
        value = value.strip().lower()
        if value.startswith("["):  # [::1]:8765
            name, _, rest = value[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ("" if not rest else None)
        else:
            name, _, port = value.rpartition(":") if ":" in value else (value, "", "")
        bound = str(self.server_address[1])
        if port is None or port != bound and not (port == "" and bound == "80"):
            return False
        name = name.rstrip(".")
        if name in self.host_names:
            return True
        if self.wildcard:
            try:
                ipaddress.ip_address(name)
                return True
            except ValueError:
                return False
        return False

    def handle_error(self, request, client_address):  # an exception that escaped a handler
        err = sys.exc_info()[1]
        if isinstance(err, CONNECTION_GONE):
            sys.stderr.write(
                f"{client_address[0]} connection closed by the client ({type(err).__name__})\n"
            )
            return
        super().handle_error(request, client_address)


def make_server(site: Site, host: str, port: int, *, read_timeout: float = READ_TIMEOUT) -> Server:
    handler = type("SiteHandler", (Handler,), {"site": site, "timeout": read_timeout})
    try:
        server = Server((host, port), handler, host_names=(host,))
    except (OSError, OverflowError) as err:  # OverflowError: a port outside 0-65535
        raise UserError(
            f"cannot listen on {host}:{port} ({getattr(err, 'strerror', None) or err}); expected a free port "
            f"(or --port 0 for any free port) and a local address",
            field="--port",
        ) from None
    return server


def serve(site: Site, host: str = "127.0.0.1", port: int = 8765) -> None:
    # an unreachable MLflow server must not hang a page for minutes of retries
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    server = make_server(site, host, port)
    bound_host, bound_port = server.server_address[:2]
    threading.Thread(target=site.warm, name="warm", daemon=True).start()
    print(
        f"gates dashboard: serving http://{bound_host}:{bound_port}/ (read-only; Ctrl-C stops)",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
