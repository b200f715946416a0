"""A deliberately lenient upstream behind the gateway, on a real WSGI server:
it routes the way the most forgiving frameworks do, so that any path or
header trick that gets past the gateway shows up as the wrong handler
running.

usage: lenient_upstream.py LOG [--gunicorn DIR]
  Prints "READY <port>"; one JSON line per request is appended to LOG and
  returned as the body. Served by the standard library's wsgiref, or with
  --gunicorn by the gunicorn installed in DIR (a `pip install --target`
  folder, so that two versions can be tested side by side), with gunicorn's
  defaults: `forwarded_allow_ips` is 127.0.0.1 and ::1, so a gateway on the
  same host is a trusted proxy to it, and gunicorn takes a request header
  `SCRIPT_NAME` as the application's mount point and cuts it off the path
  (version 21 from any peer).

Routing: X-Original-URL / X-Rewrite-URL win over the path (IIS, Symfony);
the path is percent-decoded twice, `\\` is `/`, `;parameters` are dropped
from segments (Tomcat), `//` collapses, dot segments resolve, a format
suffix on the last segment is dropped (Rails' `(.:format)`: `/admin.json`
is `/admin`), and case is ignored as Java's `equalsIgnoreCase` ignores it. A path under /admin, or the host
admin.gw.test (from the last entry of X-Forwarded-Host, else Host; case,
port and a trailing dot ignored), runs the "admin" handler, which a real
application would only serve to an authenticated user. Header names are
folded as lighttpd does: every character other than a letter or digit is
the same.

Each line records the handler, the identity and forwarding headers that
arrived, the headers of upstream meta-data (CGI variables, rewriting
middleware, authenticating proxies) that arrived, the WSGI SCRIPT_NAME and
URL scheme the application saw, the method and the body's length.
"""
import json
import os
import posixpath
import re
import socket
import sys
import urllib.parse
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

# Headers of upstream meta-data that a client must never get through the
# gateway (folded names; the gateway's list is longer).
META = {
    "script-name", "path-info", "remote-user", "remote-addr", "auth-type",
    "request-uri", "server-name", "x-script-name", "x-scheme", "remote-groups",
    "x-remote-user", "x-remote-addr", "x-originating-ip", "x-envoy-original-path",
    "x-original-method", "x-webauth-user", "x-ssl-client-cert",
}


def lenient(path):
    # WSGI hands the path over as bytes in a latin-1 str: read it as UTF-8.
    path = path.encode("latin-1", "replace").decode("utf-8", "replace")
    for _ in range(2):
        path = urllib.parse.unquote(path)
    path = path.replace("\\", "/")
    segments = [s.split(";", 1)[0] for s in path.split("/")]
    path = "/" + "/".join(s for s in segments if s)
    path = posixpath.normpath(path)
    path = re.sub(r"(?<=[^/])\.[A-Za-z0-9]+$", "", path)
    # Case ignored character by character, upper then lower case, as Java's
    # equalsIgnoreCase does: `ı`, `ſ` and the Kelvin sign read as i, s, k.
    return "".join(c.upper().lower() for c in path)


def lenient_host(environ):
    host = environ.get("HTTP_X_FORWARDED_HOST") or environ.get("HTTP_HOST") or ""
    host = host.split(",")[-1].strip().lower()
    host = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return host.rstrip(".")


def read_body(environ):
    stream = environ.get("wsgi.input")
    length = environ.get("CONTENT_LENGTH") or ""
    if length.isdigit():
        return stream.read(int(length)) if stream else b""
    # gunicorn de-chunks a chunked body and reads it to its end.
    if environ.get("SERVER_SOFTWARE", "").startswith("gunicorn") and stream:
        return stream.read()
    return b""


def record(environ, stack, handler):
    identity = {}
    forwarding = {}
    meta = {}
    for k, v in environ.items():
        if not k.startswith("HTTP_"):
            continue
        name = re.sub(r"[^a-z0-9]", "-", k[5:].lower())
        if name.startswith("x-auth-"):
            identity[name] = v
        elif name.startswith("x-forwarded") or name in (
            "forwarded", "x-real-ip", "x-original-url", "x-rewrite-url", "x-http-method-override"):
            forwarding[name] = v
        elif name in META:
            meta[name] = v
    return {
        "stack": stack,
        "handler": handler,
        "method": environ.get("REQUEST_METHOD", ""),
        "path": environ.get("PATH_INFO", ""),
        "script_name": environ.get("SCRIPT_NAME", ""),
        "scheme": environ.get("wsgi.url_scheme", ""),
        "identity": identity,
        "forwarding": forwarding,
        "meta": meta,
    }


def app(environ, start_response):
    routed_by = environ.get("HTTP_X_ORIGINAL_URL") or environ.get("HTTP_X_REWRITE_URL")
    path = lenient(routed_by or environ.get("PATH_INFO", "/"))
    admin = path == "/admin" or path.startswith("/admin/") or lenient_host(environ) == "admin.gw.test"
    stack = "gunicorn" if environ.get("SERVER_SOFTWARE", "").startswith("gunicorn") else "wsgi"
    line = record(environ, stack, "admin" if admin else "public")
    line["body"] = len(read_body(environ))
    line = json.dumps(line)
    with open(LOG, "a") as f:
        f.write(line + "\n")
    body = line.encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def serve_gunicorn(folder):
    sys.path.insert(0, folder)
    from gunicorn.app.base import BaseApplication

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.set_inheritable(True)

    class Server(BaseApplication):
        def load_config(self):
            self.cfg.set("bind", [f"fd://{sock.fileno()}"])
            self.cfg.set("workers", 1)
            self.cfg.set("loglevel", "warning")
            self.cfg.set("accesslog", None)

        def load(self):
            return app

    print(f"READY {sock.getsockname()[1]}", flush=True)
    Server().run()


LOG = None


def main():
    global LOG
    LOG = sys.argv[1]
    if len(sys.argv) == 4 and sys.argv[2] == "--gunicorn":
        serve_gunicorn(sys.argv[3])
        return
    server = make_server("127.0.0.1", 0, app, server_class=WSGIServer, handler_class=Quiet)
    print(f"READY {server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
