"""A single-page application (tests/support/spa/, on oidc-client-ts) signs
a person in with latchkey in headless Chromium:

  1. sign-in: the app sends the browser to the authorization endpoint
     (PKCE), the person types the password and allows the app on the
     consent page, the app exchanges the code from the browser (CORS) and
     reads userinfo;
  2. two tabs of the app refresh at the same moment with the same refresh
     token (the rotation race), and both stay signed in: each refreshes
     again afterwards and calls userinfo;
  3. silent sign-in: with the tokens forgotten, `prompt=none` brings the
     app back signed in without any page (the browser's session, and the
     consent remembered);
  4. RP-initiated logout: the app's sign-out goes to latchkey's logout
     page, the person confirms, and the browser is back at the app's
     post-logout URI; `prompt=none` then answers login_required, and the
     refresh token the app kept no longer works.

The app is served over https at https://spa.test:PORT (Chromium maps the
name to 127.0.0.1 and accepts the throwaway certificate): an https
redirect URI is what lets latchkey remember consent for a public client
(a loopback one could be any local program, RFC 8252 §8.6).

usage: spa_browser.py ISSUER CLIENT_ID EMAIL PASSWORD OIDC_CLIENT_TS_JS
  Prints "READY <port>" once the app listens; the caller registers the
  client (redirect URI https://spa.test:PORT/callback, post-logout URI
  https://spa.test:PORT/signed-out, allowed origin https://spa.test:PORT)
  and writes a line to stdin. Then one JSON line per step; exits 1 at the
  first step that fails. Needs Chromium, openssl and websocket-client.
"""
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time

from passkey_browser import BROWSER, Page, start_chromium, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))


def report(**line):
    print(json.dumps(line), flush=True)


def fail(step, **why):
    report(step=step, state="error", **why)
    sys.exit(1)


def app_server(issuer, client_id, library, tmp):
    """The app's files over https on a free loopback port."""
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=spa.test", "-addext", "subjectAltName=DNS:spa.test",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    config = json.dumps({"authority": issuer, "client_id": client_id, "userinfo": f"{issuer}/oauth/userinfo"})
    files = {
        "/config.js": ("application/javascript", f"window.SPA_CONFIG = {config};".encode()),
        "/oidc-client-ts.min.js": ("application/javascript", open(library, "rb").read()),
        "/spa.js": ("application/javascript", open(os.path.join(HERE, "spa", "spa.js"), "rb").read()),
    }
    index = ("text/html", open(os.path.join(HERE, "spa", "index.html"), "rb").read())

    class Files(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            kind, body = files.get(self.path.split("?")[0], index)
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def fire(tab, expression):
    """Starts `expression` without waiting for it: it may navigate away."""
    tab.call("Runtime.evaluate", {"expression": f"{expression}; 0"})


def outcome(page, what, path=None, timeout=20):
    """spa.result once the app's last operation has one (at `path`: after
    a round trip through latchkey, on the app's page there)."""
    at = f"location.pathname === {json.dumps(path)} && " if path else ""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if page.js(f"document.readyState === 'complete' && {at}!!(window.spa && window.spa.result)"):
                return page.js("window.spa.result")
        except RuntimeError:
            pass  # between documents
        time.sleep(0.05)
    raise RuntimeError(f"{what}: no outcome; at {page.js('location.href')}")


def main():
    issuer, client_id, email, password, library = sys.argv[1:6]
    if not BROWSER:
        fail("start", status="no chromium on PATH (apt-get install chromium)")
    tmp = tempfile.mkdtemp(prefix="latchkey-spa-")
    server = app_server(issuer, client_id, library, tmp)
    origin = f"https://spa.test:{server.server_address[1]}"
    print(f"READY {server.server_address[1]}", flush=True)
    sys.stdin.readline()
    browser, profile, page = start_chromium(["--host-resolver-rules=MAP spa.test 127.0.0.1",
                                             "--ignore-certificate-errors"])
    try:
        page.call("Page.enable")

        def at_app(tab, path="/"):
            tab.call("Page.navigate", {"url": origin + path})
            wait_for(tab, "window.spa", f"the app at {path}")

        # 1. Sign-in with PKCE, the password and the consent page.
        at_app(page)
        fire(page, "spa.signIn()")
        wait_for(page, "document.getElementById('password')", "latchkey's sign-in page")
        page.fill("email", email)
        page.fill("password", password)
        page.js("document.querySelector('form[action=\"/oauth/login\"]').requestSubmit()")
        wait_for(page, "document.querySelector('form[action=\"/oauth/consent\"]')", "the consent page")
        page.js("document.querySelector('button[value=\"allow\"]').click()")
        signed_in = outcome(page, "back at the app", "/callback")
        if not signed_in["ok"]:
            fail("sign-in", result=signed_in)
        page.js("spa.userinfo()")
        info = outcome(page, "userinfo")
        report(step="sign-in", state="done", user=signed_in["value"], userinfo=info)
        if not (info["ok"] and info["value"]["status"] == 200):
            fail("userinfo", result=info)

        # 2. Two tabs refresh with the same refresh token at the same moment.
        second = Page(page.ws_url)  # another tab of the same browser
        at_app(second)
        at_app(page)
        for tab in (page, second):
            tab.js("window.spa.result = null")
        # Both start before either answer can arrive: neither call waits.
        fire(page, "spa.refresh()")
        fire(second, "spa.refresh()")
        raced = [outcome(tab, "a refresh in the race") for tab in (page, second)]
        report(step="two tabs refresh at once", state="done" if all(r["ok"] for r in raced) else "error",
               results=raced, shared_token=signed_in["value"]["refresh_token"])
        if not all(r["ok"] for r in raced):
            sys.exit(1)
        after = []
        for tab in (page, second):
            tab.js("spa.refresh()")
            refreshed = outcome(tab, "a refresh after the race")
            tab.js("spa.userinfo()")
            after.append({"refresh": refreshed, "userinfo": outcome(tab, "userinfo after the race")})
        ok = all(a["refresh"]["ok"] and a["userinfo"]["ok"] and a["userinfo"]["value"]["status"] == 200
                 for a in after)
        report(step="both tabs stay signed in", state="done" if ok else "error", results=after)
        if not ok:
            sys.exit(1)

        # 3. prompt=none with the tokens forgotten: back signed in, no page.
        page.js("spa.forget()")
        fire(page, "spa.signInSilently()")
        silent = outcome(page, "back from prompt=none", "/callback")
        report(step="silent sign-in", state="done" if silent["ok"] else "error", result=silent,
               at=page.js("location.pathname"))
        if not silent["ok"]:
            sys.exit(1)
        kept_refresh = silent["value"]["refresh_token"]

        # 4. RP-initiated logout, confirmed on latchkey's page.
        fire(page, "spa.signOut()")
        wait_for(page, "document.querySelector('form[action=\"/oauth/logout/confirm\"]')", "the logout page")
        page.js("document.querySelector('form[action=\"/oauth/logout/confirm\"] button').click()")
        wait_for(page, "location.pathname === '/signed-out' && window.spa", "the app's post-logout page")
        report(step="logout", state="done", at=page.js("location.href").split("?")[0])
        fire(page, "spa.signInSilently()")
        after_logout = outcome(page, "prompt=none after logout", "/callback")
        report(step="prompt=none after logout", state="done" if not after_logout["ok"] else "error",
               result=after_logout)
        if after_logout["ok"]:
            sys.exit(1)
        # The app's old refresh token, presented as the app would present it.
        refused = page.js(f"""fetch({json.dumps(issuer + '/oauth/token')}, {{method: 'POST',
            headers: {{'Content-Type': 'application/x-www-form-urlencoded'}},
            body: new URLSearchParams({{grant_type: 'refresh_token', client_id: {json.dumps(client_id)},
                                        refresh_token: {json.dumps(kept_refresh or '')}}})}})
            .then(r => r.json().then(b => ({{status: r.status, error: b.error}})))""")
        report(step="refresh after logout", state="done" if refused["status"] == 400 else "error", result=refused)
        if refused["status"] != 400:
            sys.exit(1)
    except RuntimeError as e:
        fail("browser", status=str(e))
    finally:
        browser.kill()
        browser.wait()
        shutil.rmtree(profile, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
        server.shutdown()


if __name__ == "__main__":
    main()
