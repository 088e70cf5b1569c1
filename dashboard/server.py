"""`gates dashboard`: the pages over HTTP (stdlib ThreadingHTTPServer), read-only: GET and HEAD only.

One daemon thread per request being answered, a listen backlog of REQUEST_QUEUE_SIZE (the stdlib's 5
made a burst of clients wait for SYN retransmits), a client that goes away is one log line, and a
request whose Host header is not an address this server answers to is refused with 421 (DNS
rebinding: a page on another site must not read the dashboard through a name that resolves to
127.0.0.1).

What one client can hold is bounded (issue #28: 3,000 clients sending a byte every 5 s held 3,000
threads; issue #39: 300 such clients on 127.0.0.1 filled that address's cap, and every other local
client, the browser too, got 503). A connection is first read by one thread for all (HeadReader), with
no thread of its own, until its request line and headers have arrived whole: within REQUEST_DEADLINE of
its accept and with no gap over READ_TIMEOUT between bytes, else it is closed and logged in one line.
At most MAX_PENDING_PER_CLIENT connections per address and MAX_PENDING in all may still be sending
their request: one more makes room by closing the oldest of that address (or, at the total, of the
address with the most), so a flood pushes out its own connections, never a request that arrives whole
at once. Only a request that has arrived whole takes a thread, and only those count against
MAX_CONNECTIONS_PER_CLIENT per address and MAX_CONNECTIONS in all (one more is answered 503 with
Retry-After and closed at once, without a thread of its own). Its answer must be taken within
ANSWER_DEADLINE of its first byte, each write waiting at most READ_TIMEOUT (a request body is never
waited for: the server speaks HTTP/1.0 and closes after each answer). The limits are Server
attributes, so a test sets them small on its instance.
"""

from __future__ import annotations

import io
import ipaddress
import os
import resource
import selectors
import socket
import sys
import threading
import time
import traceback
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from gates.dashboard import render
from gates.dashboard.site import Site
from gates.errors import UserError

READ_TIMEOUT = 10.0  # seconds one read or write of a connection may wait
REQUEST_DEADLINE = 10.0  # seconds from a connection's accept until its last header has arrived
ANSWER_DEADLINE = 30.0  # seconds from an answer's first byte until the client has taken it all
# requests being answered: a browser opens 6 per host; the per-client cap stays above a burst of 200
# from one address (the load test), and both caps bound threads (each mostly its stack) well below
# what a process can hold
MAX_CONNECTIONS_PER_CLIENT = 256
MAX_CONNECTIONS = 512
# connections still sending their request: each is a socket and at most MAX_HEAD_BYTES on the one
# reading thread, so these caps are above any honest crowd; the total is also kept under the
# process's open-file limit (Server.__init__)
MAX_PENDING_PER_CLIENT = 512
MAX_PENDING = 1024
MAX_HEAD_BYTES = 65536  # a head not whole by then goes to a thread (the stdlib answers 414 or 431)
RETRY_AFTER = 2  # seconds, in a 503: a slot is held by a request being answered, rarely for long
REQUEST_QUEUE_SIZE = 1024  # listen backlog (the kernel caps it at net.core.somaxconn)
CONNECTION_GONE = (
    ConnectionError,
    TimeoutError,
)  # BrokenPipeError, ConnectionResetError, ...; a timeout


class DeadlineStream(io.RawIOBase):
    """A connection's socket as a file whose reads share one deadline per request and whose writes
    share one per answer: a fresh timeout per call let a client that sends (or takes) a byte now and
    then hold its thread forever."""

    def __init__(self, sock, read_timeout: float, head: bytes = b""):
        self.sock, self.read_timeout, self.head = sock, read_timeout, head
        self.start(float("inf"), float("inf"))

    def start(self, request_s: float, answer_s: float, read_by: float | None = None) -> None:
        """A new request: it must arrive within request_s from now (or by read_by, the monotonic
        time its connection's deadline ends), its answer within answer_s of the answer's first byte."""
        self.request_s, self.answer_s = request_s, answer_s
        self.read_by = time.monotonic() + request_s if read_by is None else read_by
        self.write_by = None

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.head:  # what HeadReader already read of the request
            n = min(len(b), len(self.head))
            b[:n], self.head = self.head[:n], self.head[n:]
            return n
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


@dataclass
class Arrived:
    """What HeadReader hands a request's thread: the bytes it read (the head, whole or cut at
    MAX_HEAD_BYTES) and the monotonic time the connection's request deadline ends."""

    head: bytes = b""
    read_by: float | None = None


@dataclass
class Pending:
    """A connection still sending its request."""

    client_address: tuple
    read_by: float  # its request deadline
    idle_by: float  # the last byte's time + the read timeout
    head: bytearray = field(default_factory=bytearray)
    line_end: int = -1  # where the request line ends, once it has

    def whole(self, new: int) -> bool:
        """Whether the request line and headers have arrived, the last `new` bytes just now (a blank
        line ends them; a request line without an HTTP version has none, and the handler answers it
        as before). Only the new bytes and the 2 before them are searched: a head that drips in byte
        by byte is not scanned again per byte."""
        start = max(0, len(self.head) - new - 2)
        if self.line_end < 0:
            self.line_end = self.head.find(b"\n", start)
            if self.line_end < 0:
                return False
            if len(self.head[: self.line_end].split()) != 3:
                return True
        tail = self.head[start:]
        return b"\n\n" in tail or b"\n\r\n" in tail


class HeadReader:
    """One thread reads every accepted connection, without blocking, until its request has arrived
    whole, then hands it to Server.dispatch; what may wait here and for how long is bounded (the
    module's docstring). Its state is its thread's own: the accepting thread only queues and wakes."""

    def __init__(self, server: Server):
        self.server = server
        self.selector = selectors.DefaultSelector()
        self.incoming: deque = deque()  # (socket, address) accepted, not yet read
        self.waker, self.wake = socket.socketpair()
        self.waker.setblocking(False)
        self.wake.setblocking(False)
        self.selector.register(self.waker, selectors.EVENT_READ)
        self.pending: OrderedDict[socket.socket, Pending] = OrderedDict()  # oldest first
        self.per_client: Counter[str] = Counter()
        self.stopped = False
        self.thread = threading.Thread(target=self.run, name="dashboard-heads", daemon=True)
        self.thread.start()

    def add(self, sock: socket.socket, client_address) -> None:
        """On the accepting thread: queue a fresh connection."""
        self.incoming.append((sock, client_address))
        self._wake()

    def stop(self) -> None:
        self.stopped = True
        self._wake()
        self.thread.join(5)

    def _wake(self) -> None:
        try:
            self.wake.send(b"x")
        except OSError:  # its buffer is full of wakes not yet read: one is enough
            pass

    def run(self) -> None:
        try:
            while not self.stopped:
                timeout = None
                if self.pending:
                    soonest = min(min(p.read_by, p.idle_by) for p in self.pending.values())
                    timeout = min(max(soonest - time.monotonic(), 0.0), 1.0)
                for key, _ in self.selector.select(timeout):
                    if key.fileobj is self.waker:
                        self._drain_wakes()
                    else:
                        self._guarded(key.fileobj, self._read)
                while self.incoming:
                    self._guarded(self.incoming[0][0], self._admit)
                self._expire()
        finally:
            for sock in list(self.pending):
                self._close(sock)
            while self.incoming:
                self.server.shutdown_request(self.incoming.popleft()[0])
            self.selector.close()
            self.waker.close()
            self.wake.close()

    def _guarded(self, sock, step) -> None:
        """One connection's step; whatever it raises closes that connection (one log line), never
        this thread."""
        try:
            step(sock)
        except Exception as err:
            if sock in self.pending:
                client = self.pending[sock].client_address[0]
                self._close(sock)
            else:
                client = "?"
                if self.incoming and self.incoming[0][0] is sock:
                    client = self.incoming.popleft()[1][0]
                self.server.shutdown_request(sock)
            sys.stderr.write(f"{client} connection closed ({type(err).__name__}: {err})\n")

    def _drain_wakes(self) -> None:
        try:
            while self.waker.recv(4096):
                pass
        except OSError:
            pass

    def _admit(self, sock) -> None:
        sock, client_address = self.incoming.popleft()
        client = client_address[0]
        server = self.server
        if self.per_client[client] >= server.max_pending_per_client:
            self._evict(client, f"{self.per_client[client]} connections from this address")
        elif len(self.pending) >= server.max_pending:
            crowded = max(self.per_client, key=self.per_client.__getitem__)
            self._evict(crowded, f"{len(self.pending)} connections in all")
        now = time.monotonic()
        sock.setblocking(False)
        self.pending[sock] = Pending(
            client_address, now + server.request_deadline, now + server.read_timeout
        )
        self.per_client[client] += 1
        self.selector.register(sock, selectors.EVENT_READ)
        self._read(sock)  # what came with the connection (most requests)

    def _evict(self, client: str, why: str) -> None:
        oldest = next(sock for sock, p in self.pending.items() if p.client_address[0] == client)
        self._close(oldest)
        sys.stderr.write(
            f"{client} connection closed: {why} still sending their request (the oldest makes room)\n"
        )

    def _read(self, sock) -> None:
        pending = self.pending.get(sock)
        if pending is None:  # closed earlier in this round
            return
        try:
            data = sock.recv(MAX_HEAD_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except CONNECTION_GONE as err:
            self._close(sock)
            sys.stderr.write(
                f"{pending.client_address[0]} connection closed by the client ({type(err).__name__})\n"
            )
            return
        if not data and not pending.head:  # connected and went away: nothing to answer
            self._close(sock)
            return
        pending.head += data
        pending.idle_by = time.monotonic() + self.server.read_timeout
        if not data or pending.whole(len(data)) or len(pending.head) >= MAX_HEAD_BYTES:
            # whole (or cut, or ended by the client: the handler answers what came, as before)
            self._forget(sock)
            sock.setblocking(True)
            self.server.dispatch(
                sock, pending.client_address, Arrived(bytes(pending.head), pending.read_by)
            )

    def _expire(self) -> None:
        now = time.monotonic()
        late = [(s, p) for s, p in self.pending.items() if now >= min(p.read_by, p.idle_by)]
        for sock, pending in late:
            self._close(sock)
            if now >= pending.read_by:
                why = f"request deadline of {self.server.request_deadline:g} s passed"
            else:
                why = f"no byte for {self.server.read_timeout:g} s"
            sys.stderr.write(f"{pending.client_address[0]} request timed out: {why}\n")

    def _forget(self, sock) -> None:
        pending = self.pending.pop(sock)
        client = pending.client_address[0]
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:  # a flood from many addresses leaves no keys
            del self.per_client[client]
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):
            pass

    def _close(self, sock) -> None:
        self._forget(sock)
        self.server.shutdown_request(sock)


class Handler(BaseHTTPRequestHandler):
    site: Site  # set on the subclass made by make_server
    server_version = "gates-dashboard"
    timeout = READ_TIMEOUT  # DeadlineStream's limit on each read and write

    def setup(self):  # StreamRequestHandler's, with files that keep the deadlines
        self.connection = self.request
        self.arrived = self.server.take_arrived(self.connection)
        self.stream = DeadlineStream(self.connection, self.timeout, self.arrived.head)
        self.rfile = io.BufferedReader(self.stream)
        self.wfile = self.stream

    def handle_one_request(self):  # deadlines per request, should the server ever keep connections
        read_by, self.arrived.read_by = self.arrived.read_by, None  # the first: from its accept
        self.stream.start(self.server.request_deadline, self.server.answer_deadline, read_by)
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
    max_pending_per_client = MAX_PENDING_PER_CLIENT
    max_pending = MAX_PENDING
    heads: HeadReader | None = None  # None until bound (TCPServer closes a server that cannot bind)

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
        self.arrived: dict[socket.socket, Arrived] = {}
        # each waiting connection is an open file: stay clear of the process's limit (EMFILE on
        # accept would spin the accept loop), with room for the threads' and the store's files
        files, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if files != resource.RLIM_INFINITY:
            self.max_pending = max(16, min(self.max_pending, files - self.max_connections - 128))
        self.heads = HeadReader(self)

    @property
    def read_timeout(self) -> float:
        return self.RequestHandlerClass.timeout

    def process_request(self, request, client_address):
        """On the accepting thread: the connection waits, without a thread, until its request has
        arrived whole (HeadReader), then dispatch."""
        self.heads.add(request, client_address)

    def dispatch(self, request, client_address, arrived: Arrived) -> None:
        """A request that has arrived whole: a thread to answer it, or at once a 503 if its address or
        the server is at its cap of requests being answered. On HeadReader's thread; never raises."""
        client = client_address[0]
        with self.open_lock:
            if self.open_per_client[client] >= self.max_connections_per_client:
                refusal = f"{self.open_per_client[client]} requests being answered for this address"
            elif self.open_connections >= self.max_connections:
                refusal = f"{self.open_connections} requests being answered"
            else:
                refusal = None
                self.open_connections += 1
                self.open_per_client[client] += 1
        if refusal:
            self.refuse(request, client, refusal)
            return
        with self.open_lock:
            self.arrived[request] = arrived
        try:
            ThreadingHTTPServer.process_request(self, request, client_address)
        except Exception as err:  # no thread started ("can't start new thread"): free the slot
            with self.open_lock:
                self.arrived.pop(request, None)
            self.release(client)
            sys.stderr.write(f"{client} connection closed ({type(err).__name__}: {err})\n")
            self.shutdown_request(request)

    def take_arrived(self, request) -> Arrived:
        with self.open_lock:
            return self.arrived.pop(request, None) or Arrived()

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
        """503 and close, without blocking: a client that reads nothing must not stall the reading
        thread."""
        sys.stderr.write(f"{client} refused with 503: {reason}\n")
        body = b"503: the dashboard has too many requests to answer; retry shortly\n"
        head = (
            f"HTTP/1.1 503 Service Unavailable\r\nRetry-After: {RETRY_AFTER}\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n"
        )
        try:
            request.setblocking(False)
            request.send(head.encode() + body)  # a fresh socket's send buffer holds it whole
            # what the client already sent: closed unread, it would reset the connection and could
            # cost the client the 503
            request.recv(65536)
        except OSError:
            pass
        self.shutdown_request(request)

    def server_close(self):
        super().server_close()
        if self.heads is not None:
            self.heads.stop()  # and every connection still sending its request is closed

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
