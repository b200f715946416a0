"""A Flask application behind the gateway, with the "ReverseProxied"
middleware that many Flask deployments copied from a well-known snippet:
it takes the mount point from an `X-Script-Name` header (cutting it off the
path Flask routes by) and the URL scheme from `X-Scheme`. Served by
Werkzeug's own server. Flask's routes: /admin and /admin/<path> run the
"admin" handler (which a real application would only serve to an
authenticated user), everything else the "public" one.

usage: flask_upstream.py LOG   (prints "READY <port>"; one JSON line per
request, as lenient_upstream.py writes them, is appended to LOG)
"""
import json
import logging
import sys

from flask import Flask, request
from werkzeug.serving import make_server

from lenient_upstream import record

LOG = sys.argv[1]
app = Flask(__name__)


class ReverseProxied:
    """Trusts the proxy in front for the mount point and the scheme."""

    def __init__(self, wsgi_app):
        self.wsgi_app = wsgi_app

    def __call__(self, environ, start_response):
        mount = environ.get("HTTP_X_SCRIPT_NAME", "")
        if mount:
            environ["SCRIPT_NAME"] = mount
            path = environ.get("PATH_INFO", "")
            if path.startswith(mount):
                environ["PATH_INFO"] = path[len(mount):]
        scheme = environ.get("HTTP_X_SCHEME", "")
        if scheme:
            environ["wsgi.url_scheme"] = scheme
        return self.wsgi_app(environ, start_response)


def answer(handler):
    line = record(request.environ, "flask", handler)
    line["body"] = len(request.get_data())
    line = json.dumps(line)
    with open(LOG, "a") as f:
        f.write(line + "\n")
    return app.response_class(line, mimetype="application/json")


@app.route("/admin", defaults={"rest": ""}, methods=["GET", "POST", "HEAD"])
@app.route("/admin/<path:rest>", methods=["GET", "POST", "HEAD"])
def admin(rest):
    return answer("admin")


@app.route("/", defaults={"rest": ""}, methods=["GET", "POST", "HEAD"])
@app.route("/<path:rest>", methods=["GET", "POST", "HEAD"])
def public(rest):
    return answer("public")


app.wsgi_app = ReverseProxied(app.wsgi_app)

if __name__ == "__main__":
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    print(f"READY {server.server_port}", flush=True)
    server.serve_forever()
