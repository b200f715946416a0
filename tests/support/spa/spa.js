// A single-page application signing in with oidc-client-ts (the library
// SPAs use: PKCE, the code exchanged from the browser by CORS, tokens kept
// in the browser). tests/support/spa_browser.py serves it over https and
// drives it in headless Chromium: window.spa is what its buttons would call.
//
// Every tab shares one signed-in user (localStorage), as an app open in
// two tabs does; `spa.result` is the last operation's outcome.
/* global oidc, SPA_CONFIG */
(function () {
  const origin = window.location.origin;
  const manager = new oidc.UserManager({
    authority: SPA_CONFIG.authority,
    client_id: SPA_CONFIG.client_id,
    redirect_uri: `${origin}/callback`,
    post_logout_redirect_uri: `${origin}/signed-out`,
    response_type: 'code',
    scope: 'openid email profile offline_access',
    userStore: new oidc.WebStorageStateStore({ store: window.localStorage }),
    automaticSilentRenew: false,
    loadUserInfo: true,
  });

  function summary(user) {
    if (!user) return { signed_in: false };
    return {
      signed_in: true,
      sub: user.profile.sub,
      email: user.profile.email,
      iss: user.profile.iss,
      aud: user.profile.aud,
      access_token: user.access_token,
      refresh_token: user.refresh_token || null,
      scope: user.scope,
    };
  }

  // Runs `work`, keeping its outcome (or its error) in spa.result.
  function track(work) {
    spa.result = null;
    return work().then(
      (value) => (spa.result = { ok: true, value }),
      (e) => (spa.result = { ok: false, error: e.error || String(e), description: e.error_description || null }),
    );
  }

  const spa = {
    result: null,
    signIn: () => manager.signinRedirect(),
    // A sign-in without any page (prompt=none): back with a code, or with
    // an error such as login_required.
    signInSilently: () => manager.signinRedirect({ prompt: 'none' }),
    refresh: () => track(() => manager.signinSilent().then(summary)),
    user: () => track(() => manager.getUser().then(summary)),
    forget: () => track(() => manager.removeUser().then(() => ({ signed_in: false }))),
    userinfo: () =>
      track(async () => {
        const user = await manager.getUser();
        const r = await fetch(SPA_CONFIG.userinfo, { headers: { Authorization: `Bearer ${user.access_token}` } });
        return { status: r.status, body: r.status === 200 ? await r.json() : null };
      }),
    signOut: () => manager.signoutRedirect(),
  };
  window.spa = spa;

  window.addEventListener('DOMContentLoaded', () => {
    if (window.location.pathname === '/callback') {
      track(() => manager.signinCallback().then(summary)).then(() => {
        document.getElementById('who').textContent = spa.result.ok ? `signed in as ${spa.result.value.email}` : spa.result.error;
      });
    }
  });
})();
