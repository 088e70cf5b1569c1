"""The dashboard server against slow and numerous clients (issue #28, item 11; issue #39, item 9), over
real sockets on 127.0.0.1: a request that drips in is cut at its deadline, an answer nobody reads
likewise, connections still sending their request hold no thread and count against no request that has
arrived whole (300 of them from one address do not keep other local clients out), a crowd of them makes
room by closing its own oldest, and a request over the per-address or the total cap of requests being
answered is refused at once with 503. The limits are set small on each test's server; every loop is
bounded and every socket has a timeout."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from gates.dashboard.site import Site
from tests.test_dashboard_server import (  # noqa: F401 (site: a fixture)
    burst,
    request,
    site,
    start,
    status,
)


@contextmanager
def serving(site: Site, read_timeout: float | None = None, **limits):
    """A server on a free port with the given limits (Server attributes) in place of the defaults."""
    server = start(site, **({} if read_timeout is None else {"read_timeout": read_timeout}))
    for name, value in limits.items():
        setattr(server, name, value)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def held(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection from source that has sent its request line and Host, never the blank line."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    s.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
    return s


def finish(s: socket.socket) -> bytes:
    """Complete a held request; the whole answer."""
    s.sendall(b"Connection: close\r\n\r\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def open_and_silent(s: socket.socket) -> bool:
    """Whether the server has neither answered nor closed s."""
    return not select.select([s], [], [], 0)[0]


def wait_until(condition: Callable[[], bool], seconds: float) -> float:
    """Seconds until condition held (polled); fails after seconds."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < seconds, f"not within {seconds} s"
        time.sleep(0.02)
    return time.monotonic() - started


def test_a_request_that_drips_in_is_cut_at_its_deadline(site, capfd):
    """One byte every 0.3 s never trips a per-read timeout; the whole request has a deadline."""
    with serving(site, request_deadline=1.0) as server:
        port = server.server_address[1]
        baseline = threading.active_count()
        drip = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Drip: ".encode() + b"a" * 100
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            for byte in drip:
                try:
                    s.sendall(bytes([byte]))
                    if select.select([s], [], [], 0.3)[0] and s.recv(100) == b"":
                        break  # the server closed the connection
                except OSError:  # reset: closed
                    break
                if time.monotonic() - started > 4:
                    break
            cut = time.monotonic() - started
        assert 0.8 < cut < 2.0, f"cut after {cut:.2f} s"
        wait_until(lambda: threading.active_count() <= baseline, 2)  # its thread is gone
    log = capfd.readouterr().err
    assert [line for line in log.splitlines() if "deadline" in line], log[-2000:]
    assert "Traceback" not in log


def test_an_answer_nobody_reads_is_cut_at_its_deadline(site, capfd):
    """A page far larger than the socket buffers, to a client that reads nothing."""

    class Huge(Site):
        def index(self, **kw):
            return "x" * 40_000_000

    huge = Huge(site.claims.runs_dir, site.claims.contracts_dir, site.store.uri, site.mlflow_ui)
    with serving(huge, answer_deadline=1.0) as server:
        port = server.server_address[1]
        baseline = threading.active_count()
        with held(port) as s:
            s.sendall(b"\r\n")
            wait_until(lambda: threading.active_count() > baseline, 2)
            assert wait_until(lambda: threading.active_count() <= baseline, 4) < 3.5
    log = capfd.readouterr().err
    assert [line for line in log.splitlines() if "answer" in line and "deadline" in line], log[
        -2000:
    ]


class Gate(Site):
    """A site whose first `held` index pages wait until the test opens the gate: requests being
    answered, for as long as the test needs them."""

    def __init__(self, site: Site, held: int):
        super().__init__(
            site.claims.runs_dir, site.claims.contracts_dir, site.store.uri, site.mlflow_ui
        )
        self.held, self.waiting = held, 0
        self.gate, self.lock = threading.Event(), threading.Lock()

    def index(self, **kw):
        with self.lock:
            wait, self.held = self.held > 0, self.held - 1
            self.waiting += wait
        if wait:
            self.gate.wait(30)
        return super().index(**kw)


@contextmanager
def in_flight(server, gated: Gate, n: int, source: str = "127.0.0.1"):
    """n requests from source being answered (their pages wait on the gate); their statuses after."""
    port, statuses = server.server_address[1], []

    def one(source):
        with socket.create_connection(("127.0.0.1", port), 20, source_address=(source, 0)) as s:
            s.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        statuses.append(status(data))

    threads = [
        threading.Thread(target=one, args=(source if isinstance(source, str) else source[k],))
        for k in range(n)
    ]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: gated.waiting == n, 10)
        assert server.open_connections == n
        yield statuses
    finally:
        gated.gate.set()
        for t in threads:
            t.join(20)


def test_requests_over_the_per_client_cap_get_503_at_once(site, capfd):
    """The cap counts requests being answered (threads), not connections still sending theirs."""
    gated = Gate(site, held=3)
    with serving(gated, max_connections_per_client=3, request_deadline=30.0) as server:
        port = server.server_address[1]
        holding = [held(port) for _ in range(5)]  # sending their request: they count for nothing
        try:
            with in_flight(server, gated, 3) as answered:
                for _ in range(3):
                    answer = request(port, timeout=5)
                    assert status(answer) == 503 and b"\r\nRetry-After: 2\r\n" in answer, answer
                assert server.open_connections == 3  # refused without a thread of their own
                assert all(open_and_silent(s) for s in holding)
                assert status(request(port, "/contract/none", timeout=5)) == 503
                with held(port, source="127.0.0.2") as other:  # another address has its own count
                    assert status(finish(other)) == 200
            assert answered == [200] * 3
            wait_until(lambda: server.open_connections == 0, 10)
            assert status(finish(holding.pop())) == 200  # a slot is free again
            assert all(open_and_silent(s) for s in holding)
        finally:
            for s in holding:
                s.close()
    refused = [line for line in capfd.readouterr().err.splitlines() if "503" in line]
    assert refused and all(line.startswith("127.0.0.1 refused") for line in refused), refused


def test_requests_over_the_total_cap_get_503_at_once(site):
    gated = Gate(site, held=4)
    with serving(gated, max_connections=4, request_deadline=30.0) as server:
        port = server.server_address[1]
        sources = [f"127.0.0.{n}" for n in range(2, 6)]  # one per address
        with in_flight(server, gated, 4, source=sources) as answered:
            for _ in range(3):
                assert status(request(port, timeout=5)) == 503
            assert server.open_connections == 4
        assert answered == [200] * 4
        wait_until(lambda: server.open_connections == 0, 10)
        assert status(request(port, timeout=5)) == 200


@contextmanager
def dripping(port: int, n: int, source: str = "127.0.0.1"):
    """n connections that send their request line and Host, then one more header byte every 0.2 s,
    never the blank line; closed on leaving."""
    socks = [held(port, source) for _ in range(n)]
    for s in socks:
        s.sendall(b"X-Drip: ")
    stop = threading.Event()

    def drip():
        while not stop.wait(0.2):
            for s in socks:
                try:
                    s.sendall(b"a")
                except OSError:  # closed by the server: the test says whether it should be
                    pass

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    try:
        yield socks
    finally:
        stop.set()
        dripper.join(5)
        for s in socks:
            s.close()


def test_300_drip_clients_on_one_address_keep_no_local_client_out(site):
    """Issue #39, item 9: 300 clients dripping a request from 127.0.0.1 filled that address's 256
    connections, and 8 of 28 requests from other local clients (the browser) got 503. Connections
    still sending their request wait on one reading thread, and only a request that has arrived whole
    counts against the caps: every one is answered, and the drips are neither answered nor cut (their
    deadlines are far off), nor given a thread each."""
    with serving(site, read_timeout=60.0, request_deadline=60.0) as server:
        port = server.server_address[1]
        baseline = threading.active_count()
        with dripping(port, 300) as drips:
            statuses, _ = burst(port, 20)
            assert statuses == [200] * 20, statuses
            statuses = [status(request(port, timeout=20)) for _ in range(8)]
            assert statuses == [200] * 8, statuses
            assert all(open_and_silent(s) for s in drips)
            wait_until(lambda: len(server.heads.pending) == 300, 10)
            assert threading.active_count() < baseline + 20  # the dripper, no thread per drip


def test_a_crowd_still_sending_makes_room_by_closing_its_own_oldest(site, capfd):
    with serving(site, max_pending_per_client=3, max_pending=5, request_deadline=30.0) as server:
        port = server.server_address[1]
        first = [held(port) for _ in range(3)]
        wait_until(lambda: len(server.heads.pending) == 3, 10)
        newer = held(port)  # one over the address's cap: its oldest is closed
        try:
            first[0].settimeout(10)
            assert first[0].recv(100) == b""
            assert all(open_and_silent(s) for s in (*first[1:], newer))
            # a request that arrives whole is answered (it too made room, by the next oldest)
            assert status(request(port, timeout=10)) == 200
            first[1].settimeout(10)
            assert first[1].recv(100) == b""
            assert open_and_silent(first[2]) and open_and_silent(newer)
            # at the total cap: the address with the most waiting loses its oldest, not the newcomer
            others = [held(port, "127.0.0.2"), held(port, "127.0.0.3")]
            wait_until(lambda: len(server.heads.pending) == 4, 10)
            with held(port, "127.0.0.4") as outsider:
                wait_until(lambda: len(server.heads.pending) == 5, 10)
                fifth = held(port, "127.0.0.5")
                first[2].settimeout(10)
                assert first[2].recv(100) == b""
                assert all(open_and_silent(s) for s in (newer, *others, outsider, fifth))
                assert status(finish(outsider)) == 200
                fifth.close()
            for s in others:
                s.close()
        finally:
            for s in (*first, newer):
                s.close()
    closed = [line for line in capfd.readouterr().err.splitlines() if "makes room" in line]
    assert len(closed) == 3 and all(line.startswith("127.0.0.1 ") for line in closed), closed


def test_a_page_is_served_while_drip_clients_hold_connections(site):
    # a page that waited on the drips would come after their 6 s deadline
    with serving(site, request_deadline=6.0) as server:
        port = server.server_address[1]
        holding = [held(port) for _ in range(20)]
        try:
            started = time.monotonic()
            assert status(request(port, timeout=10)) == 200
            assert time.monotonic() - started < 3
            assert all(open_and_silent(s) for s in holding)
        finally:
            for s in holding:
                s.close()
