"""Signs in to applications through latchkey's hosted sign-in pages in
headless Chromium, the way a user would: the OpenID Connect authorization
code flow from the authorization request to the application's callback,
typing into the pages and pressing their buttons.

  1. the password, then the consent page (application A);
  2. single sign-on: application B with the browser's session, no password;
  3. an authenticator app and a passkey enrolled on /ui/account (the
     DevTools protocol's virtual authenticator; pyotp as the app);
  4. the password and the authenticator's code as the second step;
  5. the password and the passkey as the second step (prompt=login);
  6. the passkey alone;
  7. the sign-up and reset pages, and logout.

Every page's Content-Security-Policy violations are collected (the pages
must work under their own policy), each page is saved as a screenshot, and
axe-core (an accessibility checker, from npm) reports its violations.

usage: oidc_browser.py BASE_URL CLIENT_A CLIENT_B EMAIL PASSWORD SHOTS_DIR AXE_JS
  BASE_URL: the service at http://localhost:PORT (WebAuthn wants a domain)
  CLIENT_A, CLIENT_B: public clients with the redirect URI
             http://127.0.0.1/callback (loopback: this script listens on a
             port of its own)
  SHOTS_DIR: where the screenshots go (one PNG per page)
  AXE_JS: axe.min.js of the axe-core package
Prints one JSON line per step; the sign-ins' lines carry the callback's
query and the token endpoint's answer to the code (exchanged at once, as
the application would). Exits 1 at
the first step that fails. Needs Chromium and websocket-client.
"""
import base64
import os
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

import pyotp

from passkey_browser import BROWSER, start_chromium, step, wait_for

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


def csp_violations(page):
    return json.loads(page.js("sessionStorage.getItem('csp') || '[]'"))


def report(**line):
    print(json.dumps(line), flush=True)


def examine(page, shots, axe_source, name):
    """Screenshot, accessibility check and policy violations of the page."""
    shot = page.call("Page.captureScreenshot", {"format": "png"})["data"]
    with open(os.path.join(shots, f"{name}.png"), "wb") as f:
        f.write(base64.b64decode(shot))
    # Evaluated by the DevTools protocol, which the page's policy
    # does not govern.
    page.js(axe_source)
    found = page.js("axe.run(document, {resultTypes: ['violations']}).then(r => ({passes: r.passes.length,"
                    " violations: r.violations.map(v => ({id: v.id, impact: v.impact, nodes: v.nodes.length}))}))")
    report(step="page", page=name, axe=found["violations"], axe_rules_passed=found["passes"],
           csp_violations=csp_violations(page))


def authorization_url(base, client_id, redirect_uri, extra=None):
    """A fresh authorization request: its URL, PKCE verifier and state."""
    verifier = b64url(secrets.token_bytes(32))
    state = b64url(secrets.token_bytes(12))
    params = {
        "response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri,
        "scope": "openid email", "state": state, "nonce": b64url(secrets.token_bytes(12)),
        "code_challenge": b64url(hashlib.sha256(verifier.encode()).digest()),
        "code_challenge_method": "S256"}
    params.update(extra or {})
    return f"{base}/oauth/authorize?{urllib.parse.urlencode(params)}", verifier, state


def exchange(base, client_id, redirect_uri, verifier, callback_url):
    """The callback's query, and the token endpoint's answer to its code
    (a public client: its id and the PKCE verifier), as the application
    would exchange it at once."""
    got = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(callback_url).query))
    form = urllib.parse.urlencode({
        "grant_type": "authorization_code", "client_id": client_id, "code": got.get("code", ""),
        "redirect_uri": redirect_uri, "code_verifier": verifier}).encode()
    try:
        with urllib.request.urlopen(f"{base}/oauth/token", data=form, timeout=20) as r:
            tokens = json.load(r)
    except urllib.error.HTTPError as e:
        tokens = {"status": e.code, "body": e.read().decode()}
    return got, tokens



def main():
    base, client_a, client_b, email, password, shots, axe_path = sys.argv[1:8]
    if not BROWSER:
        report(step="start", state="error", status="no chromium on PATH (apt-get install chromium)")
        sys.exit(1)
    os.makedirs(shots, exist_ok=True)
    axe_source = open(axe_path).read()
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

        def examine_page(name):
            examine(page, shots, axe_source, name)

        def authorize(client_id, extra=None):
            """Navigates to a fresh authorization request: its verifier and state."""
            url, verifier, state = authorization_url(base, client_id, redirect_uri, extra)
            page.call("Page.navigate", {"url": url})
            return client_id, verifier, state

        def back_at_the_application(name, request):
            client_id, verifier, state = request
            wait_for(page, "document.getElementById('callback')", f"{name}: the callback")
            got, tokens = exchange(base, client_id, redirect_uri, verifier, page.js("location.href"))
            report(step=name, state="done", query=got, tokens=tokens, state_matches=got.get("state") == state)

        def sign_in_page():
            wait_for(page, "document.getElementById('password')", "the sign-in page")

        def type_password():
            page.fill("email", email)
            page.fill("password", password)
            page.js("document.querySelector('form[action=\"/oauth/login\"]').requestSubmit()")

        def consent(name=None):
            wait_for(page, "document.querySelector('form[action=\"/oauth/consent\"]')", "the consent page")
            if name:
                examine_page(name)
            page.js("document.querySelector('button[value=\"allow\"]').click()")

        # 1. The password, then the consent page.
        request = authorize(client_a)
        sign_in_page()
        report(step="passkey offered", offered=page.js("!document.getElementById('passkey-login').hidden"))
        examine_page("sign-in")
        type_password()
        consent("consent")
        back_at_the_application("password sign-in", request)

        # 2. Single sign-on: another application, no password (the user is
        # asked to consent: a loopback client is never approved silently).
        request = authorize(client_b)
        wait_for(page, "document.querySelector('form[action=\"/oauth/consent\"]') || document.getElementById('password')",
                 "the second application's first page")
        report(step="single sign-on: first page", asked_password=page.js("!!document.getElementById('password')"))
        consent()
        back_at_the_application("single sign-on", request)

        # 3. An authenticator app and a passkey, on the account page.
        page.call("Page.navigate", {"url": base + "/ui/account"})
        wait_for(page, "document.getElementById('login')", "the account page")

        def password_login():
            page.fill("email", email)
            page.fill("password", password)
            page.click("login")

        def add_passkey():
            page.fill("current-password", password)
            page.fill("passkey-name", "Virtual authenticator")
            page.check("passkey-passwordless", True)
            page.click("passkey-add")

        step(page, "account page: password login", password_login)
        report(step="account page: applications",
               apps=page.js("[...document.querySelectorAll('#apps li')].map(li => li.dataset.client)"))
        step(page, "account page: add passkey", add_passkey)
        # Another factor needs a recent sign-in with the first one.
        step(page, "account page: sign out", lambda: page.click("logout"))
        step(page, "account page: password again", password_login)
        step(page, "account page: passkey", lambda: page.click("passkey-verify"))
        step(page, "account page: start TOTP", lambda: page.click("totp-start"))
        totp = pyotp.TOTP(page.text("totp-secret"))

        def confirm_totp():
            page.fill("totp-confirm-code", totp.now())
            page.click("totp-confirm")

        step(page, "account page: confirm TOTP", confirm_totp)
        step(page, "account page: sign out", lambda: page.click("logout"))

        # 4. The password, then the authenticator's code.
        request = authorize(client_a)
        sign_in_page()
        type_password()
        wait_for(page, "document.getElementById('code')", "the second step")
        examine_page("second-step")
        # The next step's code: the one that confirmed the app is spent.
        page.fill("code", totp.at(time.time() + 30))
        page.js("document.getElementById('code').form.requestSubmit()")
        consent()
        back_at_the_application("password and authenticator code", request)

        # 5. The password again (prompt=login), then the passkey.
        request = authorize(client_a, {"prompt": "login"})
        sign_in_page()
        type_password()
        wait_for(page, "!document.getElementById('webauthn-verify').hidden", "the passkey button of the second step")
        page.js("document.getElementById('webauthn-verify').click()")
        consent()
        back_at_the_application("password and passkey", request)

        # 6. The passkey alone.
        request = authorize(client_a, {"prompt": "login"})
        sign_in_page()
        wait_for(page, "!document.getElementById('passkey-login').hidden", "the passkey button")
        page.js("document.getElementById('passkey-login').click()")
        consent()
        back_at_the_application("passkey alone", request)

        # 7. The other pages, and logout.
        authorize(client_a, {"prompt": "login"})
        sign_in_page()
        page.js("document.querySelector('a[href^=\"/oauth/signup\"]').click()")
        wait_for(page, "document.querySelector('form[action=\"/oauth/signup\"]')", "the sign-up page")
        examine_page("sign-up")
        page.js("history.back()")
        sign_in_page()
        page.js("document.querySelector('a[href^=\"/oauth/reset\"]').click()")
        wait_for(page, "document.querySelector('form[action=\"/oauth/reset\"]')", "the reset page")
        examine_page("reset")
        page.call("Page.navigate", {"url": base + "/oauth/logout"})
        wait_for(page, "document.querySelector('form[action=\"/oauth/logout/confirm\"]')", "the logout page")
        examine_page("logout")
        page.js("document.querySelector('form[action=\"/oauth/logout/confirm\"] button').click()")
        wait_for(page, "document.title.startsWith('Signed out')", "signed out")
        examine_page("signed-out")
        authorize(client_a)
        sign_in_page()
        report(step="after logout", signed_in_page=True)
        page.call("Page.navigate", {"url": base + "/oauth/authorize?client_id=nobody"})
        wait_for(page, "document.title.startsWith('Something is wrong')", "the error page")
        examine_page("error")
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
