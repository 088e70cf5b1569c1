"""`gates dashboard`: the pages over HTTP (stdlib ThreadingHTTPServer), read-only: GET and HEAD only."""

from __future__ import annotations

import os
import sys
import threading
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from dashboard import render
from dashboard.site import Site
from gates.errors import UserError


class Handler(BaseHTTPRequestHandler):
    site: Site  # set on the subclass made by make_server
    server_version = "gates-dashboard"

    def do_GET(self):
        self._respond(send_body=True)

    def do_HEAD(self):
        self._respond(send_body=False)

    def __getattr__(self, name):  # every other method (POST, PUT, DELETE, made-up ones): 405
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self):
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, "<h1>405: the dashboard is read-only (GET and HEAD)</h1>",
                   True, {"Allow": "GET, HEAD"})

    def _respond(self, send_body: bool):
        path = unquote(urlsplit(self.path).path)
        try:
            if path in ("/", "/index.html"):
                status, html = HTTPStatus.OK, self.site.index()
            elif path.startswith("/contract/"):
                contract_id = path[len("/contract/"):].removesuffix(".html")
                html = self.site.contract(contract_id)
                status = HTTPStatus.OK
                if html is None:
                    status, html = HTTPStatus.NOT_FOUND, self.site.not_found(f"no contract {contract_id!r}")
            else:
                status, html = HTTPStatus.NOT_FOUND, self.site.not_found(f"no page {path!r}")
        except Exception:  # a page that cannot be rendered says why; the server keeps serving
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            html = render.page("Error", f"<h1>500</h1><pre>{render.e(traceback.format_exc())}</pre>", render.SERVER, "")
        self._send(status, html, send_body)

    def _send(self, status: HTTPStatus, html: str, send_body: bool, extra: dict | None = None):
        body = html.encode("utf-8")
        self.send_response(status)
        headers = {"Content-Type": "text/html; charset=utf-8", "Content-Length": str(len(body)),
                   "Cache-Control": "no-store", "Content-Security-Policy": render.CSP,
                   "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", **(extra or {})}
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format, *args):  # one short line per request on stderr
        sys.stderr.write(f"{self.address_string()} {format % args}\n")


def make_server(site: Site, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("SiteHandler", (Handler,), {"site": site})
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except (OSError, OverflowError) as err:  # OverflowError: a port outside 0-65535
        raise UserError(f"cannot listen on {host}:{port} ({getattr(err, 'strerror', None) or err}); expected a free port "
                        f"(or --port 0 for any free port) and a local address", field="--port") from None
    server.daemon_threads = True
    return server


def serve(site: Site, host: str = "127.0.0.1", port: int = 8765) -> None:
    # an unreachable MLflow server must not hang a page for minutes of retries
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    server = make_server(site, host, port)
    bound_host, bound_port = server.server_address[:2]
    threading.Thread(target=site.warm, name="warm", daemon=True).start()
    print(f"gates dashboard: serving http://{bound_host}:{bound_port}/ (read-only; Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
