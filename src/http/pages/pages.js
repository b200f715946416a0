// The sign-in pages work without JavaScript; this only adds passkeys,
// which need the browser's WebAuthn API: the second step with a passkey,
// and signing in with a passkey alone. The ceremony's answer is posted in
// the page's own form (helpers of /ui/webauthn.js).
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  if (!window.PublicKeyCredential) return;
  const step = document.getElementById("webauthn-form");
  if (step) {
    const button = document.getElementById("webauthn-verify");
    button.hidden = false;
    button.addEventListener("click", async () => {
      const options = JSON.parse(step.dataset.options);
      const cred = await navigator.credentials.get(latchkeyWebauthn.requestOptions(options));
      step.elements.webauthn.value = JSON.stringify(latchkeyWebauthn.assertionJson(cred));
      step.submit();
    });
  }
  const alone = document.getElementById("passkey-form");
  if (alone) {
    const button = document.getElementById("passkey-login");
    button.hidden = false;
    button.addEventListener("click", async () => {
      const r = await fetch("/auth/passkeys/login", { method: "POST" });
      if (!r.ok) return;
      const c = await r.json();
      const cred = await navigator.credentials.get(latchkeyWebauthn.requestOptions(c.options));
      alone.elements.ceremony_token.value = c.ceremony_token;
      alone.elements.credential.value = JSON.stringify(latchkeyWebauthn.assertionJson(cred));
      alone.submit();
    });
  }
});
