"""A webhook receiver for tests: verifies every POST with the Standard
Webhooks reference implementation (`standardwebhooks` from PyPI: the
signature, and the timestamp within its tolerance), and appends one JSON
line per request to FILE:

  {"ok": true, "id": <webhook-id>, "payload": <the verified body>}
  {"ok": false, "error": "..."}          (answered 400)

usage: webhook_receiver.py FILE PORT SECRET   (PORT 0 picks a free port)
Prints "READY <port>" once it listens.
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    out_path = None
    verifier = None

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            payload = self.verifier.verify(body, headers)
            line, code = {"ok": True, "id": headers.get("webhook-id"), "payload": payload}, 204
        except Exception as e:  # noqa: BLE001 - every failure is reported to the test
            line, code = {"ok": False, "error": f"{type(e).__name__}: {e}"}, 400
        with LOCK, open(self.out_path, "a") as f:
            f.write(json.dumps(line) + "\n")
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()


def main():
    out_path, port, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    Handler.out_path = out_path
    Handler.verifier = Webhook(secret)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"READY {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
