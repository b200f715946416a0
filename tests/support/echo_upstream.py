"""An application behind an authenticating proxy (tests/it/oauth2_proxy.rs):
every request is answered with the request's method, path and headers as
JSON, so the test sees what the proxy passed on and whether a request got
through at all.

usage: echo_upstream.py
  Prints "READY <port>" once it listens on a free loopback port.
"""

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Echo(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
print(f"READY {server.server_address[1]}", flush=True)
server.serve_forever()
