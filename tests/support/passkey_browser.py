"""Drives latchkey's hosted page (/ui/account) in headless Chromium with a
virtual authenticator (the DevTools protocol's WebAuthn domain: a platform
authenticator with user verification, as a phone or a laptop's fingerprint
reader), the way a user would: typing into the page's fields and pressing
its buttons. It enrols a passkey (allowed to sign in alone) and an
authenticator app, then signs in with the password and the passkey, with
the password and a TOTP code, and with the passkey alone.

usage: passkey_browser.py BASE_URL EMAIL PASSWORD
  BASE_URL: the service at http://localhost:PORT (WebAuthn wants a domain)
Prints one JSON line per step: {"step": ..., "status": <the page's status
line>, "state": "done"|"error", ...}; exits 1 at the first step that fails.
Needs Chromium (Debian's `chromium`), websocket-client and pyotp (PyPI).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pyotp
import websocket

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Page:
    """One tab, spoken to over the DevTools protocol."""

    def __init__(self, ws_url):
        self.ws_url = ws_url
        self.ws = websocket.create_connection(ws_url, timeout=30)
        self.next_id = 0
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def call(self, method, params=None, session=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and getattr(self, "session", None):
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            answer = json.loads(self.ws.recv())
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def js(self, expression):
        r = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def fill(self, element_id, value):
        self.js(f"document.getElementById({json.dumps(element_id)}).value = {json.dumps(value)}")

    def check(self, element_id, on):
        self.js(f"document.getElementById({json.dumps(element_id)}).checked = {json.dumps(on)}")

    def click(self, element_id):
        # Not hidden: the user can see what they press.
        visible = self.js(f"!!document.getElementById({json.dumps(element_id)}).offsetParent")
        if not visible:
            raise RuntimeError(f"#{element_id} is not visible")
        self.js(f"document.getElementById({json.dumps(element_id)}).click()")

    def settle(self, timeout=20):
        """Waits for the page's status line to leave `busy`."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.js("({state: document.getElementById('status').dataset.state,"
                        " text: document.getElementById('status').textContent})")
            if s["state"] in ("done", "error"):
                return s
            time.sleep(0.05)
        raise RuntimeError("the page did not finish: " + json.dumps(s))

    def text(self, element_id):
        return self.js(f"document.getElementById({json.dumps(element_id)}).textContent")


def start_chromium(extra_args=()):
    """Headless Chromium with a throwaway profile (and `extra_args`):
    (process, profile dir, a Page on a new tab). The caller kills the
    process and removes the dir."""
    profile = tempfile.mkdtemp(prefix="latchkey-chromium-")
    browser = subprocess.Popen(
        [BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--remote-debugging-port=0", *extra_args, "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.time() + 30
        while not (os.path.exists(port_file) and len(open(port_file).read().split("\n")) >= 2):
            if time.time() > deadline or browser.poll() is not None:
                raise RuntimeError("chromium did not start")
            time.sleep(0.1)
        port, path = open(port_file).read().split("\n")[:2]
        return browser, profile, Page(f"ws://127.0.0.1:{port}{path}")
    except BaseException:
        browser.kill()
        browser.wait()
        shutil.rmtree(profile, ignore_errors=True)
        raise


def wait_for(page, expression, what, timeout=20):
    """Waits until a loaded document of `page` makes `expression` true."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if page.js(f"document.readyState === 'complete' && !!({expression})"):
                return
        except RuntimeError:
            pass  # the page is between documents
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not reached; at {page.js('location.href')}")


def step(page, name, action, expect_done=True, **extra):
    page.js("document.getElementById('status').dataset.state = 'busy'")
    action()
    s = page.settle()
    line = dict({"step": name, "status": s["text"], "state": s["state"]}, **extra)
    print(json.dumps(line), flush=True)
    if (s["state"] == "done") != expect_done:
        sys.exit(1)
    return s


def main():
    base, email, password = sys.argv[1:4]
    if not BROWSER:
        print(json.dumps({"step": "start", "state": "error", "status": "no chromium on PATH (apt-get install chromium)"}))
        sys.exit(1)
    browser, profile, page = start_chromium()
    try:
        page.call("Page.enable")
        page.call("WebAuthn.enable", {"enableUI": False})
        page.call("WebAuthn.addVirtualAuthenticator", {"options": {
            "protocol": "ctap2", "ctap2Version": "ctap2_1", "transport": "internal",
            "hasResidentKey": True, "hasUserVerification": True, "isUserVerified": True,
            "automaticPresenceSimulation": True}})
        page.call("Page.navigate", {"url": base + "/ui/account"})
        deadline = time.time() + 20
        while page.js("document.readyState") != "complete" or not page.js("!!document.getElementById('login')"):
            if time.time() > deadline:
                raise RuntimeError("the page did not load")
            time.sleep(0.05)

        def password_login():
            page.fill("email", email)
            page.fill("password", password)
            page.click("login")

        step(page, "password login", password_login)

        def add_passkey():
            page.fill("current-password", password)
            page.fill("passkey-name", "Virtual authenticator")
            page.check("passkey-passwordless", True)
            page.click("passkey-add")

        step(page, "add passkey", add_passkey)
        codes = page.js("[...document.querySelectorAll('#recovery-codes li')].map(li => li.textContent)")
        factors = page.js("[...document.querySelectorAll('#factors li')].map(li => li.dataset.type)")
        print(json.dumps({"step": "after passkey", "recovery_codes": len(codes), "factors": factors}), flush=True)

        step(page, "sign out", lambda: page.click("logout"))
        step(page, "password again", password_login)
        step(page, "second factor: passkey", lambda: page.click("passkey-verify"))
        print(json.dumps({"step": "amr", "after": "password and passkey", "amr": page.text("amr")}), flush=True)

        # An authenticator app too, confirmed with pyotp as the app.
        step(page, "start TOTP", lambda: page.click("totp-start"))
        secret = page.text("totp-secret")
        qr = page.js("document.getElementById('totp-qr').src.startsWith('data:image/svg+xml')")

        def confirm_totp():
            page.fill("totp-confirm-code", pyotp.TOTP(secret).now())
            page.click("totp-confirm")

        step(page, "confirm TOTP", confirm_totp, qr=qr)
        factors = page.js("[...document.querySelectorAll('#factors li')].map(li => li.dataset.type)")
        print(json.dumps({"step": "factors", "factors": sorted(factors)}), flush=True)

        step(page, "sign out", lambda: page.click("logout"))
        step(page, "password, then TOTP offered", password_login)
        offered = page.js("({totp: !document.getElementById('totp-form').hidden,"
                          " webauthn: !document.getElementById('webauthn-choice').hidden,"
                          " recovery: !document.getElementById('recovery-form').hidden})")
        print(json.dumps({"step": "offered", "offered": offered}), flush=True)

        def totp_verify():
            # The next step's code: the one just used to confirm is spent.
            page.fill("totp-code", pyotp.TOTP(secret).at(time.time() + 30))
            page.click("totp-verify")

        step(page, "second factor: TOTP", totp_verify)
        print(json.dumps({"step": "amr", "after": "password and TOTP", "amr": page.text("amr")}), flush=True)

        step(page, "sign out", lambda: page.click("logout"))
        step(page, "passkey alone", lambda: page.click("passkey-login"))
        print(json.dumps({"step": "amr", "after": "passkey alone", "amr": page.text("amr"),
                          "who": page.text("who")}), flush=True)
        print(json.dumps({"step": "end", "state": "done"}), flush=True)
    except Exception as e:  # reported to the test, which fails on it
        print(json.dumps({"step": "crash", "state": "error", "status": repr(e)}), flush=True)
        sys.exit(1)
    finally:
        browser.kill()
        browser.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
