"""A local stand-in for GitHub's OAuth and REST API, for the tests of
latchkey's GitHub upstream (tests/it/federation/github.rs): github.com
cannot be reached from the tests, so this serves the endpoints latchkey
uses as GitHub documents them, at the paths of a GitHub Enterprise Server
(docs.github.com, "Authorizing OAuth apps", "REST API endpoints for users",
"REST API endpoints for emails"):

- GET  /login/oauth/authorize: client_id, redirect_uri, scope, state,
  code_challenge, code_challenge_method (S256 only). An unknown client is a
  404 page; a redirect_uri other than the registered one is sent to the
  registered one with error=redirect_uri_mismatch. The person signed in
  here (set by the test, below) authorizes at once, as for an app they
  authorized before: back to redirect_uri with code and state, or with
  error=access_denied when the test says they decline.
- POST /login/oauth/access_token: client_id and client_secret in the form,
  code, redirect_uri, code_verifier. Refusals are HTTP 200 with an
  "error" (bad_verification_code, incorrect_client_credentials,
  redirect_uri_mismatch), as GitHub answers them. JSON only with
  "Accept: application/json", else form-encoded. A code is single-use and
  lives ten minutes.
- GET  /api/v3/user and /api/v3/user/emails: "Authorization: Bearer" or
  "token" with an access token; 401 "Bad credentials" without one; 403
  without a User-Agent header (GitHub refuses those); /user/emails needs the
  user:email scope (404 without it, as GitHub answers).

The test controls it on /_test/ (not GitHub's):
- POST /_test/signed-in: a JSON user {"login", "id", "name", "emails":
  [{"email", "primary", "verified"}]} is the person signed in at GitHub
  now; {"declines": true} declines the next authorization.
- GET  /_test/requests: the token and API requests seen, with their headers
  (names lower-cased).

    python3 github_site.py '{"clients": [{"client_id", "client_secret", "redirect_uri"}]}'
    prints "ready <base URL>" and serves until its stdin closes.
"""

import base64
import hashlib
import json
import secrets
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONFIG = json.loads(sys.argv[1])
CLIENTS = {c["client_id"]: c for c in CONFIG["clients"]}
STATE = {"user": None, "declines": False, "codes": {}, "tokens": {}, "seen": []}
LOCK = threading.Lock()


class GitHub(BaseHTTPRequestHandler):
    def log_message(self, *_):
        pass

    def reply(self, status, body, content_type="application/json", headers=()):
        data = body if isinstance(body, bytes) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def json(self, status, doc):
        self.reply(status, json.dumps(doc))

    def redirect(self, to, params):
        sep = "&" if "?" in to else "?"
        self.reply(302, b"", "text/html", [("Location", to + sep + urllib.parse.urlencode(params))])

    def lowered(self):
        return {k.lower(): v for k, v in self.headers.items()}

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n).decode()

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/login/oauth/authorize":
            return self.authorize(q)
        if url.path in ("/api/v3/user", "/api/v3/user/emails"):
            return self.api(url.path)
        if url.path == "/_test/requests":
            with LOCK:
                return self.json(200, STATE["seen"])
        self.json(404, {"message": "Not Found"})

    def do_POST(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/login/oauth/access_token":
            return self.access_token(dict(urllib.parse.parse_qsl(self.body())))
        if url.path == "/_test/signed-in":
            who = json.loads(self.body())
            with LOCK:
                STATE["declines"] = bool(who.get("declines"))
                if not STATE["declines"]:
                    STATE["user"] = who
            return self.json(200, {})
        self.json(404, {"message": "Not Found"})

    def authorize(self, q):
        client = CLIENTS.get(q.get("client_id"))
        if client is None:
            return self.reply(404, "<h1>404</h1>", "text/html")
        registered = client["redirect_uri"]
        state = q.get("state", "")
        if q.get("redirect_uri", registered) != registered:
            return self.redirect(registered, {"error": "redirect_uri_mismatch", "state": state})
        if q.get("code_challenge") and q.get("code_challenge_method") != "S256":
            return self.redirect(registered, {"error": "invalid_request", "state": state})
        with LOCK:
            if STATE["declines"]:
                STATE["declines"] = False
                return self.redirect(registered, {
                    "error": "access_denied",
                    "error_description": "The user has denied your application access.",
                    "state": state,
                })
            code = secrets.token_hex(10)
            STATE["codes"][code] = {
                "client_id": client["client_id"],
                "redirect_uri": registered,
                "challenge": q.get("code_challenge"),
                "scope": q.get("scope", ""),
                "user": STATE["user"],
                "until": time.time() + 600,
            }
        self.redirect(registered, {"code": code, "state": state})

    def access_token(self, form):
        with LOCK:
            STATE["seen"].append({"path": self.path, "headers": self.lowered(), "form_keys": sorted(form)})
            client = CLIENTS.get(form.get("client_id"))
            if client is None or not secrets.compare_digest(
                form.get("client_secret", ""), client["client_secret"]
            ):
                return self.token_answer({"error": "incorrect_client_credentials"})
            grant = STATE["codes"].pop(form.get("code", ""), None)
            if grant is None or grant["until"] < time.time() or grant["client_id"] != client["client_id"]:
                return self.token_answer({"error": "bad_verification_code"})
            if form.get("redirect_uri", grant["redirect_uri"]) != grant["redirect_uri"]:
                return self.token_answer({"error": "redirect_uri_mismatch"})
            if grant["challenge"]:
                digest = hashlib.sha256(form.get("code_verifier", "").encode()).digest()
                if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != grant["challenge"]:
                    return self.token_answer({"error": "bad_verification_code"})
            token = "gho_" + secrets.token_hex(18)
            STATE["tokens"][token] = grant
        scope = ",".join(grant["scope"].split())
        self.token_answer({"access_token": token, "token_type": "bearer", "scope": scope})

    def token_answer(self, doc):
        if "application/json" in (self.headers.get("Accept") or ""):
            return self.json(200, doc)
        self.reply(200, urllib.parse.urlencode(doc), "application/x-www-form-urlencoded")

    def api(self, path):
        with LOCK:
            STATE["seen"].append({"path": path, "headers": self.lowered()})
            if not self.headers.get("User-Agent"):
                return self.reply(403, "Request forbidden by administrative rules. "
                                  "Please make sure your request has a User-Agent header", "text/plain")
            auth = (self.headers.get("Authorization") or "").split(" ", 1)
            grant = STATE["tokens"].get(auth[1]) if len(auth) == 2 and auth[0].lower() in ("bearer", "token") else None
            if grant is None:
                return self.json(401, {"message": "Bad credentials"})
            user = grant["user"]
        if path == "/api/v3/user":
            return self.json(200, {k: user.get(k) for k in ("login", "id", "name")} | {"email": None})
        if "user:email" not in grant["scope"].split():
            return self.json(404, {"message": "Not Found"})
        self.json(200, [dict(e, visibility=None) for e in user.get("emails", [])])


server = ThreadingHTTPServer(("127.0.0.1", 0), GitHub)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(f"ready http://127.0.0.1:{server.server_address[1]}", flush=True)
sys.stdin.read()
