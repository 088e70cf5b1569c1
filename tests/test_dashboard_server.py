"""The dashboard server under load and against other sites (issue #17, section 5), over real sockets on
127.0.0.1: a burst of connections, half-sent requests, clients that reset, Host headers of other
names. Every loop is bounded and every socket has a timeout."""

from __future__ import annotations

import shutil
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from gates.dashboard.server import make_server
from gates.dashboard.site import Site
from tests.conftest import ROOT

CONTRACTS = ("c05-structural-probe.yaml", "spr-ordered-hash.yaml")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    """Two pending contracts (no evidence, no store): the pages need no training."""
    root = tmp_path_factory.mktemp("dash-load")
    (root / "contracts").mkdir()
    for name in CONTRACTS:
        shutil.copy(ROOT / "contracts" / name, root / "contracts" / name)
    site = Site(
        root / "runs",
        root / "contracts",
        f"sqlite:///{root / 'mlflow.db'}",
        "http://127.0.0.1:5000",
    )
    site.index()  # warm: imports and claim checks, so that timings measure the server
    return site


def start(site: Site, **kwargs):
    server = make_server(site, "127.0.0.1", 0, **kwargs)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return server


@pytest.fixture(scope="module")
def server(site):
    server = start(site)
    yield server
    server.shutdown()
    server.server_close()


def request(
    port: int,
    path: str = "/",
    host: str | None = "default",
    timeout: float = 20,
    method: str = "GET",
) -> bytes:
    """One HTTP/1.1 request on a fresh connection; the whole answer."""
    host = f"127.0.0.1:{port}" if host == "default" else host
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        head = f"{method} {path} HTTP/1.1\r\n" + (f"Host: {host}\r\n" if host is not None else "")
        s.sendall((head + "Connection: close\r\n\r\n").encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def burst(port: int, n: int, path: str = "/") -> tuple[list[int], float]:
    """n requests at once, one thread each: (statuses, slowest seconds)."""
    results, start_line = [], threading.Barrier(n)

    def one():
        start_line.wait(timeout=30)
        t = time.perf_counter()
        try:
            results.append((status(request(port, path)), time.perf_counter() - t))
        except OSError as e:
            results.append((repr(e), time.perf_counter() - t))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return [r[0] for r in results], max(r[1] for r in results)


def listen_drops() -> int | None:
    """The kernel's count of connections dropped at a full listen queue (TcpExt ListenDrops in
    /proc/net/netstat; None where it cannot be read): what a too-small backlog does, seen without a
    clock (a busy machine stretches every answer, never this count)."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:]))
            return int(row["ListenDrops"]) if "ListenDrops" in row else None
    return None


def assert_none_dropped(before: int | None, n: int) -> None:
    after = listen_drops()
    if before is not None and after is not None:
        assert after == before, f"{after - before} of {n} connections dropped at the listen queue"


def test_a_burst_of_200_connections_is_served_without_waiting_on_the_backlog(server):
    """With the stdlib's listen backlog of 5, SYNs beyond it were dropped: clients waited 1, 3, 7 s for
    retransmits (up to 8-15 s). Now none is dropped at the listen queue (the kernel's count), and no
    client waits out a chain of retransmits (a bound loose enough for a busy CI machine)."""
    port = server.server_address[1]
    before = listen_drops()
    statuses, slowest = burst(port, 200)
    assert statuses == [200] * 200
    assert_none_dropped(before, 200)
    assert slowest < 5, f"slowest of 200 took {slowest:.2f} s"


def test_half_sent_requests_neither_starve_others_nor_stay_open(site):
    # a client starved by the half-sent ones would wait out their read timeout: 4 s, far above what
    # an answer takes even on a busy machine
    server = start(site, read_timeout=4.0)
    port = server.server_address[1]
    try:
        half = []
        for _ in range(60):
            s = socket.create_connection(("127.0.0.1", port), timeout=20)
            s.sendall(
                f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()
            )  # and never the blank line
            half.append(s)
        before = listen_drops()
        statuses, slowest = burst(port, 50)
        assert statuses == [200] * 50 and slowest < 3, (statuses, slowest)
        assert_none_dropped(before, 50)
        t = time.perf_counter()
        for s in half:  # the server drops each after its read timeout
            assert s.recv(100) == b""
        assert time.perf_counter() - t < 12
        for s in half:
            s.close()
    finally:
        server.shutdown()
        server.server_close()


def test_a_client_that_goes_away_is_one_log_line_not_a_traceback(server, capfd):
    port = server.server_address[1]
    for _ in range(30):  # ask, then reset the connection (RST) before the answer is read
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    deadline = time.monotonic() + 10
    log = ""
    while "connection closed by the client" not in log and time.monotonic() < deadline:
        time.sleep(0.1)
        log += capfd.readouterr().err
    assert status(request(port)) == 200  # still serving
    time.sleep(0.3)
    log += capfd.readouterr().err
    assert "Traceback" not in log and "Exception occurred" not in log, log[-3000:]
    gone = [line for line in log.splitlines() if "connection closed by the client" in line]
    assert gone and all(
        line.startswith("127.0.0.1 connection closed by the client (") for line in gone
    ), gone


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "LocalHost:{port}", "[::1]:{port}", None]
)
def test_the_addresses_it_serves_are_accepted(server, host):
    port = server.server_address[1]
    assert status(request(port, host=host.format(port=port) if host else None)) == 200


@pytest.mark.parametrize(
    "host",
    [
        "evil.example:{port}",
        "127.0.0.1.nip.io:{port}",
        "localhost.evil.example:{port}",
        "127.0.0.1:{other}",
        "localhost",
        "",
        "127.0.0.1:{port}\r\nHost: evil.example",
    ],
)
def test_a_host_header_naming_another_site_is_refused(server, host):
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 must not read the dashboard."""
    port = server.server_address[1]
    for method in ("GET", "HEAD", "POST"):
        answer = request(port, host=host.format(port=port, other=port + 1), method=method)
        assert status(answer) == 421, answer[:200]
        body = answer.split(b"\r\n\r\n", 1)[1]
        assert body == (
            b""
            if method == "HEAD"
            else f"<h1>421: this dashboard answers to 127.0.0.1:{port} only</h1>".encode()
        )


def test_pages_under_concurrent_first_views(site):
    """Cold contract pages viewed by many threads at once (the contract cache is filled under a lock)."""
    fresh = Site(site.claims.runs_dir, site.claims.contracts_dir, site.store.uri, site.mlflow_ui)
    server = start(fresh)
    try:
        port = server.server_address[1]
        for name in CONTRACTS:
            statuses, _ = burst(port, 40, f"/contract/{Path(name).stem}")
            assert statuses == [200] * 40
        assert status(request(port, "/contract/nothing-here")) == 404
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_that_fails_to_render_is_a_500_without_a_traceback(site, capfd):
    """Whatever breaks inside a page, the visitor sees what failed in one sentence, never a traceback
    with the server's file paths; the log keeps the details on one line."""

    class Broken(Site):
        def index(self, **kw):
            raise RuntimeError("the runs folder vanished")

    broken = Broken(
        site.claims.runs_dir, site.claims.contracts_dir, site.store.uri, "http://127.0.0.1:5000"
    )
    server = start(broken)
    try:
        answer = request(server.server_address[1], "/")
    finally:
        server.shutdown()
        server.server_close()
    assert status(answer) == 500
    body = answer.decode()
    assert "RuntimeError: the runs folder vanished" in body
    assert "Traceback" not in body and "site.py" not in body and ".py&quot;" not in body
    log = capfd.readouterr().err
    (line,) = [x for x in log.splitlines() if "error rendering /" in x]  # the details: one log line
    assert "Traceback" in line and "RuntimeError: the runs folder vanished" in line
