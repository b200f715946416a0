"""A deliberately lenient upstream behind the gateway, on a real WSGI server
(the standard library's wsgiref): it routes the way the most forgiving
frameworks do, so that any path or header trick that gets past the gateway
shows up as the wrong handler running.

usage: lenient_upstream.py LOG   (prints "READY <port>"; one JSON line per
request is appended to LOG and returned as the body)

Routing: X-Original-URL / X-Rewrite-URL win over the path (IIS, Symfony);
the path is percent-decoded twice, `\\` is `/`, `;parameters` are dropped
from segments (Tomcat), `//` collapses, dot segments resolve, and case is
ignored. A path under /admin, or the host admin.gw.test (from the last entry
of X-Forwarded-Host, else Host; case, port and a trailing dot ignored), runs
the "admin" handler, which a real application would only serve to an
authenticated user. Header names are folded as lighttpd does: every
character other than a letter or digit is the same.
"""
import json
import posixpath
import re
import sys
import urllib.parse
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


def lenient(path):
    for _ in range(2):
        path = urllib.parse.unquote(path)
    path = path.replace("\\", "/")
    segments = [s.split(";", 1)[0] for s in path.split("/")]
    path = "/" + "/".join(s for s in segments if s)
    path = posixpath.normpath(path)
    return path.lower()


def lenient_host(environ):
    host = environ.get("HTTP_X_FORWARDED_HOST") or environ.get("HTTP_HOST") or ""
    host = host.split(",")[-1].strip().lower()
    host = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return host.rstrip(".")


def app(environ, start_response):
    routed_by = environ.get("HTTP_X_ORIGINAL_URL") or environ.get("HTTP_X_REWRITE_URL")
    path = lenient(routed_by or environ.get("PATH_INFO", "/"))
    admin = path == "/admin" or path.startswith("/admin/") or lenient_host(environ) == "admin.gw.test"
    handler = "admin" if admin else "public"
    identity = {}
    forwarding = {}
    for k, v in environ.items():
        if not k.startswith("HTTP_"):
            continue
        name = re.sub(r"[^a-z0-9]", "-", k[5:].lower())
        if name.startswith("x-auth-"):
            identity[name] = v
        elif name.startswith("x-forwarded") or name in (
            "forwarded", "x-real-ip", "x-original-url", "x-rewrite-url", "x-http-method-override"):
            forwarding[name] = v
    record = {
        "stack": "wsgi",
        "handler": handler,
        "path": environ.get("PATH_INFO", ""),
        "identity": identity,
        "forwarding": forwarding,
    }
    line = json.dumps(record)
    with open(sys.argv[1], "a") as f:
        f.write(line + "\n")
    body = line.encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def main():
    server = make_server("127.0.0.1", 0, app, server_class=WSGIServer, handler_class=Quiet)
    print(f"READY {server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
