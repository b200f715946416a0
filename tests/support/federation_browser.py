"""Signs in to an application through latchkey's "Continue with ..." in
headless Chromium, the upstream being node-oidc-provider (its development
pages accept any login and password): the way tests/it/federation.rs
checks with its own HTTP client, here with a real browser's cookies
(latchkey at http://localhost:PORT and the upstream at
http://127.0.0.1:PORT are different sites, so the way back is a cross-site
navigation).

  new:  a new person: "Continue with", the upstream's sign-in and consent,
        back at the application (a new account);
  link: a person whose address has an account here: "Continue with", the
        upstream, back on latchkey's sign-in page (409), the account's
        password, the question "Link ...?", "Link", back at the
        application; then again through the upstream (signed in there
        already), straight back at the application.

usage: federation_browser.py MODE BASE_URL CLIENT EMAIL PASSWORD SHOTS_DIR AXE_JS
  CLIENT: a public client with the redirect URI http://127.0.0.1/callback
          (loopback: this script listens on a port of its own)
Prints one JSON line per step (pages with their policy violations and
axe-core's findings; sign-ins with the token endpoint's answer). Exits 1 at
the first step that fails.
"""
import http.server
import json
import os
import shutil
import sys
import threading

from oidc_browser import RECORD_CSP, Callback, authorization_url, examine, exchange, report
from passkey_browser import BROWSER, start_chromium, wait_for


def main():
    mode, base, client_id, email, password, shots, axe_path = sys.argv[1:8]
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

        def examine_page(name):
            examine(page, shots, axe_source, name)

        def authorize(extra=None):
            url, verifier, _ = authorization_url(base, client_id, redirect_uri, extra)
            page.call("Page.navigate", {"url": url})
            return verifier

        def back_at_the_application(name, verifier):
            # A loopback public client is asked for consent every time.
            consent = "document.querySelector('form[action=\"/oauth/consent\"]')"
            wait_for(page, f"document.getElementById('callback') || {consent}", f"{name}: the callback")
            if page.js(f"!!{consent}"):
                page.js("document.querySelector('button[value=\"allow\"]').click()")
            wait_for(page, "document.getElementById('callback')", f"{name}: the callback")
            got, tokens = exchange(base, client_id, redirect_uri, verifier, page.js("location.href"))
            report(step=name, state="done", query=got, tokens=tokens)

        def continue_with(shot=None):
            wait_for(page, "document.querySelector('p.upstream a')", "the sign-in page's upstream link")
            if shot:
                examine_page(shot)
            page.js("document.querySelector('p.upstream a').click()")

        def at_the_upstream():
            """node-oidc-provider's development pages: its sign-in, then its consent."""
            wait_for(page, "document.querySelector('input[name=\"login\"]')", "the upstream's sign-in page")
            page.js("document.querySelector('input[name=\"login\"]').value = %s" % json.dumps(email))
            page.js("document.querySelector('input[name=\"password\"]').value = 'any'")
            page.js("document.querySelector('input[name=\"login\"]').form.submit()")
            wait_for(page, "document.querySelector('input[name=\"prompt\"][value=\"consent\"]')",
                     "the upstream's consent page")
            page.js("document.querySelector('input[name=\"prompt\"][value=\"consent\"]').form.submit()")

        if mode == "new":
            verifier = authorize()
            continue_with("sign-in-with-upstream")
            at_the_upstream()
            back_at_the_application("new person", verifier)
        else:
            verifier = authorize()
            continue_with()
            at_the_upstream()
            wait_for(page, "document.getElementById('password') && document.querySelector('p.message')",
                     "latchkey's sign-in page again, with its message")
            report(step="asked for the password", message=page.js("document.querySelector('p.message').textContent"),
                   email=page.js("document.getElementById('email').value"))
            examine_page("upstream-address-taken")
            page.fill("password", password)
            page.js("document.querySelector('form[action=\"/oauth/login\"]').requestSubmit()")
            wait_for(page, "document.querySelector('form[action=\"/oauth/link\"]')", "the question")
            report(step="asked to link", text=page.js("document.querySelector('main p').textContent"))
            examine_page("link")
            page.js("document.querySelector('button[value=\"link\"]').click()")
            back_at_the_application("linked", verifier)
            # Again, through the upstream (signed in there already).
            verifier = authorize({"prompt": "login"})
            continue_with()
            back_at_the_application("through the link", verifier)
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
