// The reference client of latchkey's JSON API (docs/api.md, docs/mfa.md):
// sign in with a password and, when the account has one, a second factor;
// sign in with a passkey; add and remove second factors. The access token
// lives in this page's memory only.
"use strict";

const state = { access: null, refresh: null, mfaToken: null, webauthn: null, totpId: null };
const $ = (id) => document.getElementById(id);

// Where things stand, for people and for the browser test (data-state:
// busy, done or error).
function status(text, kind) {
  const s = $("status");
  s.textContent = text;
  s.dataset.state = kind;
}

async function api(method, path, body, auth) {
  const headers = {};
  if (body !== undefined) headers["content-type"] = "application/json";
  if (auth) headers["authorization"] = "Bearer " + state.access;
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = null; }
  return { status: r.status, body: json };
}

// The WebAuthn helpers are /ui/webauthn.js's (loaded first).
const { creationOptions, requestOptions, registrationJson, assertionJson } = latchkeyWebauthn;

function show(section) {
  for (const id of ["signed-out", "step-up", "set-password", "signed-in"]) $(id).hidden = id !== section;
}

async function signedIn(pair) {
  state.access = pair.access_token;
  state.refresh = pair.refresh_token;
  state.mfaToken = null;
  const v = await api("GET", "/auth/validate", undefined, true);
  $("who").textContent = v.body.email;
  $("amr").textContent = (v.body.amr || []).join(" ");
  $("acr").textContent = v.body.acr || "";
  show("signed-in");
  await listFactors();
  await listApps();
  await listIdentities();
  status("Signed in with " + (v.body.amr || []).join(" "), "done");
}

function failed(r) {
  const b = r.body || {};
  status((b.error || r.status) + ": " + (b.message || "failed"), "error");
}

async function loginAnswer(r) {
  if (r.status === 200) return signedIn(r.body);
  if (r.status === 401 && r.body && r.body.error === "MFA_REQUIRED") {
    state.mfaToken = r.body.mfa_token;
    state.webauthn = r.body.webauthn || null;
    const f = r.body.factors || [];
    $("totp-form").hidden = !f.includes("totp");
    $("webauthn-choice").hidden = !f.includes("webauthn");
    $("recovery-form").hidden = !f.includes("recovery_code");
    show("step-up");
    return status("Second factor needed: " + f.join(", "), "done");
  }
  failed(r);
}

async function verify(proof) {
  status("Checking…", "busy");
  await loginAnswer(await api("POST", "/auth/mfa/verify", Object.assign({ mfa_token: state.mfaToken }, proof)));
}

async function listFactors() {
  const r = await api("GET", "/auth/mfa/factors", undefined, true);
  if (r.status !== 200) return failed(r);
  const ul = $("factors");
  ul.replaceChildren();
  for (const f of r.body.factors) {
    const li = document.createElement("li");
    li.dataset.type = f.type;
    li.textContent = f.name + " (" + f.type + (f.passwordless ? ", signs in alone" : "") + ") ";
    const rm = document.createElement("button");
    rm.type = "button";
    rm.textContent = "Remove";
    rm.className = "remove";
    rm.addEventListener("click", () => run(async () => {
      const d = await api("DELETE", "/auth/mfa/factors/" + encodeURIComponent(f.id), undefined, true);
      if (d.status !== 204) return failed(d);
      await listFactors();
      status("Removed " + f.name, "done");
    }));
    li.append(rm);
    ul.append(li);
  }
  $("recovery-left").textContent = r.body.recovery_codes_left + " recovery codes left";
}

// The applications the user consented to (GET /auth/consents).
async function listApps() {
  const r = await api("GET", "/auth/consents", undefined, true);
  if (r.status !== 200) return failed(r);
  const ul = $("apps");
  ul.replaceChildren();
  for (const c of r.body.consents) {
    const li = document.createElement("li");
    li.dataset.client = c.client_id;
    li.textContent = (c.client_name || c.client_id) + ": " + c.scope + " ";
    const rm = document.createElement("button");
    rm.type = "button";
    rm.textContent = "Withdraw";
    rm.className = "remove";
    rm.addEventListener("click", () => run(async () => {
      const d = await api("DELETE", "/auth/consents/" + encodeURIComponent(c.client_id), undefined, true);
      if (d.status !== 204) return failed(d);
      await listApps();
      status("Withdrawn: " + (c.client_name || c.client_id), "done");
    }));
    li.append(rm);
    ul.append(li);
  }
}

// Sign-ins with other providers (GET /auth/identities): each linked
// identity with a way to unlink it, and a way to link one more. Linking
// leaves for the provider (POST /auth/identities gives the address and
// sets the journey's cookie) and comes back to this page with ?linked=NAME
// or ?link_error=CODE; this page keeps no token, so the person signs in
// again then.
async function listIdentities() {
  const r = await api("GET", "/auth/identities", undefined, true);
  if (r.status !== 200) return failed(r);
  const ul = $("identities");
  ul.replaceChildren();
  for (const i of r.body.identities) {
    const li = document.createElement("li");
    li.dataset.upstream = i.upstream;
    li.textContent = i.upstream + (i.email ? " (" + i.email + ")" : "") + " ";
    const rm = document.createElement("button");
    rm.type = "button";
    rm.textContent = "Unlink";
    rm.className = "remove";
    rm.addEventListener("click", () => run(async () => {
      const d = await api("DELETE", "/auth/identities/" + encodeURIComponent(i.id), undefined, true);
      if (d.status !== 204) return failed(d);
      await listIdentities();
      status("Unlinked " + i.upstream, "done");
    }));
    li.append(rm);
    ul.append(li);
  }
  const links = $("link-upstreams");
  links.replaceChildren();
  for (const u of r.body.upstreams || []) {
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.upstream = u.name;
    b.textContent = "Link " + u.display_name;
    b.addEventListener("click", () => run(async () => {
      const password = $("current-password").value;
      const d = await api("POST", "/auth/identities", { upstream: u.name, current_password: password || undefined }, true);
      if (d.status !== 200) return failed(d);
      window.location.assign(d.body.url);
    }));
    links.append(b);
  }
}

// Back from linking a provider.
const back = new URLSearchParams(window.location.search);
const linkErrors = {
  linked_elsewhere: "that account is linked to another account here already",
  disabled: "this account is disabled",
  journey: "the link took too long, or was started in another browser",
  failed: "the provider could not be reached, or refused",
};
// The name only as an upstream's name can be (the URL is anyone's to write).
const linkedName = /^[a-z0-9-]{1,32}$/.test(back.get("linked") || "") ? back.get("linked") : "the provider";
if (back.has("linked")) status("Linked " + linkedName + ". Sign in to see it.", "done");
if (back.has("link_error")) status("Not linked: " + (linkErrors[back.get("link_error")] || "failed"), "error");

function showRecovery(codes) {
  if (!codes) return;
  const ol = $("recovery-codes");
  ol.replaceChildren(...codes.map((c) => Object.assign(document.createElement("li"), { textContent: c })));
  $("recovery").hidden = false;
}

// One action at a time, with its failure shown rather than lost.
async function run(action) {
  status("Working…", "busy");
  try {
    await action();
  } catch (e) {
    status("error: " + e, "error");
  }
}

function on(id, event, action) {
  $(id).addEventListener(event, (e) => {
    e.preventDefault();
    run(action);
  });
}

on("login-form", "submit", async () => {
  const r = await api("POST", "/auth/login", { email: $("email").value, password: $("password").value });
  await loginAnswer(r);
});

on("signup-form", "submit", async () => {
  const r = await api("POST", "/auth/register", {
    email: $("signup-email").value,
    password: $("signup-password").value,
  });
  if (r.status !== 201) return failed(r);
  $("code-form").hidden = false;
  status("Check your email for a 6-digit code", "done");
});

// A verification that set no password (two sign-ups raced for the address,
// and neither password is trusted): the session may choose one, once.
on("code-form", "submit", async () => {
  const r = await api("POST", "/auth/verify-otp", { email: $("signup-email").value, code: $("signup-code").value });
  if (r.status === 200 && r.body.status === "PASSWORD_REQUIRED") {
    state.access = r.body.access_token;
    state.refresh = r.body.refresh_token;
    $("set-password-why").textContent = r.body.message;
    show("set-password");
    return status("Your address is verified; choose a password", "done");
  }
  await loginAnswer(r);
});

on("set-password-form", "submit", async () => {
  const r = await api("POST", "/auth/password", { new_password: $("new-password").value }, true);
  if (r.status !== 204) return failed(r);
  await signedIn({ access_token: state.access, refresh_token: state.refresh });
});

on("totp-form", "submit", () => verify({ code: $("totp-code").value }));
on("recovery-form", "submit", () => verify({ recovery_code: $("recovery-code").value }));
on("passkey-verify", "click", async () => {
  const cred = await navigator.credentials.get(requestOptions(state.webauthn));
  await verify({ webauthn: assertionJson(cred) });
});

on("passkey-login", "click", async () => {
  const start = await api("POST", "/auth/passkeys/login", undefined);
  if (start.status !== 200) return failed(start);
  const cred = await navigator.credentials.get(requestOptions(start.body.options));
  const r = await api("POST", "/auth/passkeys/login/finish", {
    ceremony_token: start.body.ceremony_token,
    credential: assertionJson(cred),
  });
  await loginAnswer(r);
});

on("logout", "click", async () => {
  await api("POST", "/auth/logout", { refresh_token: state.refresh });
  state.access = state.refresh = null;
  $("recovery").hidden = true;
  $("totp-enrol").hidden = true;
  show("signed-out");
  status("Signed out", "done");
});

on("totp-start", "click", async () => {
  const r = await api("POST", "/auth/mfa/totp", {
    name: "Authenticator app",
    current_password: $("current-password").value,
  }, true);
  if (r.status !== 201) return failed(r);
  state.totpId = r.body.id;
  $("totp-qr").src = "data:image/svg+xml;base64," + btoa(r.body.qr_svg);
  $("totp-secret").textContent = r.body.secret;
  $("totp-enrol").hidden = false;
  status("Scan the code, then enter the first code the app shows", "done");
});

on("totp-confirm-form", "submit", async () => {
  const path = "/auth/mfa/totp/" + encodeURIComponent(state.totpId) + "/confirm";
  const r = await api("POST", path, { code: $("totp-confirm-code").value }, true);
  if (r.status !== 201) return failed(r);
  $("totp-enrol").hidden = true;
  showRecovery(r.body.recovery_codes);
  await listFactors();
  status("Authenticator app added", "done");
});

on("passkey-form", "submit", async () => {
  const start = await api("POST", "/auth/mfa/passkeys", {
    name: $("passkey-name").value,
    passwordless: $("passkey-passwordless").checked,
    current_password: $("current-password").value,
  }, true);
  if (start.status !== 200) return failed(start);
  const cred = await navigator.credentials.create(creationOptions(start.body.options));
  const r = await api("POST", "/auth/mfa/passkeys/finish", {
    ceremony_token: start.body.ceremony_token,
    credential: registrationJson(cred),
  }, true);
  if (r.status !== 201) return failed(r);
  showRecovery(r.body.recovery_codes);
  await listFactors();
  status("Passkey added", "done");
});
