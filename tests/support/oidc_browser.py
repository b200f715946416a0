"""Signs in to an application through latchkey's hosted sign-in pages in
headless Chromium, the way a user would: the OpenID Connect authorization
code flow from the authorization request to the application's callback,
pressing the pages' buttons. Two sign-ins: with the password (then the
consent page), and with a passkey alone (enrolled first on /ui/account in
the same browser, with the DevTools protocol's virtual authenticator); then
the logout page. Every page's Content-Security-Policy violations are
collected: the pages must work under their own policy.

usage: oidc_browser.py BASE_URL CLIENT_ID EMAIL PASSWORD
  BASE_URL: the service at http://localhost:PORT (WebAuthn wants a domain)
  CLIENT_ID: a public client with the redirect URI http://127.0.0.1/callback
             (a loopback URI: this script listens on a port of its own)
Prints one JSON line per step; the sign-ins' lines carry the callback's
query and the token endpoint's answer to the code (exchanged at once, as
the application would). Exits 1 at
the first step that fails. Needs Chromium and websocket-client.
"""
import base64
import hashlib
import http.server
import json
import secrets
import shutil
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from passkey_browser import BROWSER, start_chromium, step

# Installed in every document before its own scripts: records what the
# page's policy blocked, per origin, across the page loads of one tab.
RECORD_CSP = """
document.addEventListener('securitypolicyviolation', e => {
  const seen = JSON.parse(sessionStorage.getItem('csp') || '[]');
  seen.push(e.violatedDirective + ' ' + e.blockedURI);
  sessionStorage.setItem('csp', JSON.stringify(seen));
});
"""


class Callback(http.server.BaseHTTPRequestHandler):
    """The application's redirect URI: answers a page that names itself."""

    def do_GET(self):
        body = b"<!doctype html><title>callback</title><p id=callback>back at the application</p>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def wait_for(page, expression, what, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if page.js(f"document.readyState === 'complete' && !!({expression})"):
                return
        except RuntimeError:
            pass  # the page is between documents
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not reached; at {page.js('location.href')}")


def csp_violations(page):
    return json.loads(page.js("sessionStorage.getItem('csp') || '[]'"))


def report(**line):
    print(json.dumps(line), flush=True)


def main():
    base, client_id, email, password = sys.argv[1:5]
    if not BROWSER:
        report(step="start", state="error", status="no chromium on PATH (apt-get install chromium)")
        sys.exit(1)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Callback)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    redirect_uri = f"http://127.0.0.1:{server.server_address[1]}/callback"
    browser, profile, page = start_chromium()
    try:
        page.call("Page.enable")
        page.call("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_CSP})
        page.call("WebAuthn.enable", {"enableUI": False})
        page.call("WebAuthn.addVirtualAuthenticator", {"options": {
            "protocol": "ctap2", "ctap2Version": "ctap2_1", "transport": "internal",
            "hasResidentKey": True, "hasUserVerification": True, "isUserVerified": True,
            "automaticPresenceSimulation": True}})

        def authorize():
            """Navigates to a fresh authorization request: its verifier and state."""
            verifier = b64url(secrets.token_bytes(32))
            state = b64url(secrets.token_bytes(12))
            query = urllib.parse.urlencode({
                "response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri,
                "scope": "openid email", "state": state, "nonce": b64url(secrets.token_bytes(12)),
                "code_challenge": b64url(hashlib.sha256(verifier.encode()).digest()),
                "code_challenge_method": "S256"})
            page.call("Page.navigate", {"url": f"{base}/oauth/authorize?{query}"})
            return verifier, state

        def back_at_the_application(name, verifier, state):
            wait_for(page, "document.getElementById('callback')", f"{name}: the callback")
            got = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(page.js("location.href")).query))
            # The application exchanges the code at once (a public client:
            # its id and the PKCE verifier).
            form = urllib.parse.urlencode({
                "grant_type": "authorization_code", "client_id": client_id, "code": got.get("code", ""),
                "redirect_uri": redirect_uri, "code_verifier": verifier}).encode()
            try:
                with urllib.request.urlopen(f"{base}/oauth/token", data=form, timeout=20) as r:
                    tokens = json.load(r)
            except urllib.error.HTTPError as e:
                tokens = {"status": e.code, "body": e.read().decode()}
            report(step=name, state="done", query=got, tokens=tokens, state_matches=got.get("state") == state)

        # 1. The password, then the consent page.
        verifier, state = authorize()
        wait_for(page, "document.getElementById('password')", "the sign-in page")
        passkey_offered = page.js("!document.getElementById('passkey-login').hidden")
        page.fill("email", email)
        page.fill("password", password)
        page.js("document.querySelector('form[action=\"/oauth/login\"]').requestSubmit()")
        wait_for(page, "document.querySelector('form[action=\"/oauth/consent\"]')", "the consent page")
        consent_text = page.js("document.querySelector('main').innerText")
        violations = csp_violations(page)
        page.js("document.querySelector('button[value=\"allow\"]').click()")
        report(step="pages", state="done", passkey_offered=passkey_offered,
               consent_text=consent_text, csp_violations=violations)
        back_at_the_application("password sign-in", verifier, state)

        # 2. A passkey enrolled on the account page of this browser...
        page.call("Page.navigate", {"url": base + "/ui/account"})
        wait_for(page, "document.getElementById('login')", "the account page")

        def password_login():
            page.fill("email", email)
            page.fill("password", password)
            page.click("login")

        step(page, "account page: password login", password_login)

        def add_passkey():
            page.fill("current-password", password)
            page.fill("passkey-name", "Virtual authenticator")
            page.check("passkey-passwordless", True)
            page.click("passkey-add")

        step(page, "account page: add passkey", add_passkey)
        step(page, "account page: sign out", lambda: page.click("logout"))

        # ... signs in alone at the next application sign-in. The browser
        # session of the first sign-in ended with the new factor (a first
        # factor ends the other sessions), so the sign-in page shows.
        verifier, state = authorize()
        wait_for(page, "!document.getElementById('passkey-login').hidden", "the passkey button")
        page.js("document.getElementById('passkey-login').click()")
        # The client asks every time (consent "explicit").
        wait_for(page, "document.querySelector('form[action=\"/oauth/consent\"]')", "the consent page again")
        page.js("document.querySelector('button[value=\"allow\"]').click()")
        back_at_the_application("passkey sign-in", verifier, state)

        # 3. Logout: a confirmation page, then signed out.
        page.call("Page.navigate", {"url": base + "/oauth/logout"})
        wait_for(page, "document.querySelector('form[action=\"/oauth/logout/confirm\"]')", "the logout page")
        violations = csp_violations(page)
        page.js("document.querySelector('form[action=\"/oauth/logout/confirm\"] button').click()")
        wait_for(page, "document.title.startsWith('Signed out')", "signed out")
        verifier, state = authorize()
        wait_for(page, "document.getElementById('password')", "the sign-in page after logout")
        report(step="logout", state="done", csp_violations=violations + csp_violations(page))
        report(step="end", state="done")
    except Exception as e:  # reported to the test, which fails on it
        report(step="crash", state="error", status=repr(e))
        sys.exit(1)
    finally:
        server.shutdown()
        browser.kill()
        browser.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
