"""The dashboard server against slow and numerous clients (issue #28, item 11), over real sockets on
127.0.0.1: a request that drips in is cut at its deadline, an answer nobody reads likewise, and a
connection over the per-address or the total cap is refused at once with 503. The limits are set small
on each test's server; every loop is bounded and every socket has a timeout."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from gates.dashboard.site import Site
from tests.test_dashboard_server import request, site, start, status  # noqa: F401 (site: a fixture)


@contextmanager
def serving(site: Site, **limits):
    """A server on a free port with the given limits (Server attributes) in place of the defaults."""
    server = start(site)
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


def test_connections_over_the_per_client_cap_get_503_at_once(site, capfd):
    with serving(site, max_connections_per_client=3, request_deadline=5.0) as server:
        port = server.server_address[1]
        holding = [held(port) for _ in range(3)]
        try:
            started = time.monotonic()
            for _ in range(3):
                answer = request(port, timeout=5)
                assert status(answer) == 503 and b"\r\nRetry-After: 5\r\n" in answer, answer
            assert time.monotonic() - started < 3  # at once: well under the 5 s deadline
            assert all(open_and_silent(s) for s in holding)  # the capped ones are still served
            with held(port, source="127.0.0.2") as other:  # another address has its own count
                assert status(finish(other)) == 200
            assert status(finish(holding.pop())) == 200
            wait_until(lambda: status(request(port, timeout=5)) == 200, 2)  # a slot is free again
        finally:
            for s in holding:
                s.close()
    refused = [line for line in capfd.readouterr().err.splitlines() if "503" in line]
    assert refused and all(line.startswith("127.0.0.1 refused") for line in refused), refused


def test_connections_over_the_total_cap_get_503_at_once(site):
    with serving(site, max_connections=4, request_deadline=5.0) as server:
        port = server.server_address[1]
        holding = [held(port, source=f"127.0.0.{n}") for n in range(2, 6)]  # one per address
        try:
            started = time.monotonic()
            for _ in range(3):
                assert status(request(port, timeout=5)) == 503
            assert time.monotonic() - started < 3  # at once: well under the 5 s deadline
            assert all(open_and_silent(s) for s in holding)
            assert status(finish(holding.pop())) == 200
            wait_until(lambda: status(request(port, timeout=5)) == 200, 2)
        finally:
            for s in holding:
                s.close()


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
