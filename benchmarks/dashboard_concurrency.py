"""`gates dashboard` under hostile load, over real sockets (bounded: about 20 s).

Starts `gates dashboard --port 0` on a temporary project (two pending contracts), then measures:
200 concurrent requests; the same with 60 half-sent requests holding connections open; how long a
half-sent request stays open; 50 clients that reset the connection before reading the answer (the
server's log is checked for tracebacks); and the answer to a Host header of another name.

    python benchmarks/dashboard_concurrency.py
"""

from __future__ import annotations

import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def get(
    port: int, path: str = "/", host: str | None = None, timeout: float = 40
) -> tuple[float, float, bytes]:
    """(seconds to connect, seconds to the whole answer, the answer's first bytes)."""
    t = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        connected = time.perf_counter() - t
        s.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host or f'127.0.0.1:{port}'}\r\nConnection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return connected, time.perf_counter() - t, data[:40]


def burst(port: int, n: int) -> str:
    results, errors = [], []

    def one():
        try:
            results.append(get(port))
        except OSError as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ok = sum(1 for r in results if b" 200 " in r[2])
    slowest = max((r[1] for r in results), default=float("nan"))
    return (
        f"{ok}/{n} ok, {len(errors)} errors, slowest connect {max((r[0] for r in results), default=0):.2f} s, "
        f"slowest answer {slowest:.2f} s, all done in {time.perf_counter() - t0:.2f} s"
    )


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="gates-dash-") as tmp:
        root = Path(tmp)
        (root / "contracts").mkdir()
        for name in ("c05-structural-probe.yaml", "spr-ordered-hash.yaml"):
            shutil.copy(ROOT / "contracts" / name, root / "contracts" / name)
        log_path = root / "server.log"
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gates", "dashboard", "--port", "0"],
                cwd=root,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        try:
            port = int(re.search(r":(\d+)/", proc.stdout.readline()).group(1))
            get(port)  # warm: imports and claim checks
            print(f"200 concurrent requests: {burst(port, 200)}")
            half = []
            for _ in range(60):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(
                    f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()
                )  # never finished
                half.append(s)
            print(f"the same beside 60 half-sent requests: {burst(port, 200)}")
            t = time.perf_counter()
            half[0].settimeout(40)
            try:
                half[0].recv(100)
                print(
                    f"a half-sent request is closed by the server after {time.perf_counter() - t:.1f} s"
                )
            except TimeoutError:
                print("a half-sent request is still open after 40 s")
            for s in half:
                s.close()
            for _ in range(50):  # ask, then reset the connection before reading the answer
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
            time.sleep(1)
            status = (
                get(port, host=f"evil.example:{port}", timeout=10)[2].split(b"\r\n")[0].decode()
            )
            print(f"Host: evil.example:{port} -> {status}")
        finally:
            proc.terminate()
            proc.wait(10)
        log = log_path.read_text()
        print(
            f"server log: {len(log.splitlines())} lines, {log.count('Traceback')} tracebacks, "
            f"{log.count('connection closed by the client')} 'connection closed by the client' lines"
        )


if __name__ == "__main__":
    main()
