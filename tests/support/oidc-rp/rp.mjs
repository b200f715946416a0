// A relying party built on openid-client (a certified OpenID Connect
// library), signing in with latchkey in tests/it/oidc.rs. The test plays
// the browser; this plays the application:
//
//   node rp.mjs start  '{"issuer","client_id","client_secret"?,"redirect_uri","scope"}'
//     -> {"url", "code_verifier", "state", "nonce"}
//   node rp.mjs finish '{...start's input, "callback", "code_verifier", "state", "nonce",
//                        "post_logout_redirect_uri"?}'
//     -> {"claims", "userinfo", "refreshed", "end_session", "access_token", "id_token"}
//
// `base`: where latchkey really listens; the issuer is a name the tests
// give it (http://latchkey.test), and every request to the issuer's origin
// goes to `base` instead (the library's own customFetch hook).
//
// On any error of the library (an id_token it refuses, a wrong iss, a
// state or nonce mismatch, ...) it prints {"error", "code"} and exits 1.
import * as client from "openid-client";

const [command, input] = process.argv.slice(2);
const p = JSON.parse(input);

async function configuration() {
  const metadata = {
    id_token_signed_response_alg: p.id_token_alg || "EdDSA",
  };
  if (p.client_secret) metadata.client_secret = p.client_secret;
  const auth = p.client_secret ? client.ClientSecretBasic(p.client_secret) : client.None();
  const issuer = new URL(p.issuer).origin;
  const to = (url) => {
    const u = String(url);
    return u.startsWith(issuer) ? p.base + u.slice(issuer.length) : u;
  };
  const customFetch = (url, options) => fetch(to(url), options);
  // The tests run latchkey over plain HTTP on a loopback address.
  const config = await client.discovery(new URL(p.issuer), p.client_id, metadata, auth, {
    execute: [client.allowInsecureRequests],
    [client.customFetch]: customFetch,
  });
  config[client.customFetch] = customFetch;
  return config;
}

try {
  const config = await configuration();
  if (command === "start") {
    const code_verifier = client.randomPKCECodeVerifier();
    const code_challenge = await client.calculatePKCECodeChallenge(code_verifier);
    const state = client.randomState();
    const nonce = client.randomNonce();
    const url = client.buildAuthorizationUrl(config, {
      redirect_uri: p.redirect_uri,
      scope: p.scope || "openid email profile",
      code_challenge,
      code_challenge_method: "S256",
      state,
      nonce,
      ...(p.extra || {}),
    });
    console.log(JSON.stringify({ url: url.href, code_verifier, state, nonce }));
  } else if (command === "finish") {
    const tokens = await client.authorizationCodeGrant(config, new URL(p.callback), {
      pkceCodeVerifier: p.code_verifier,
      expectedState: p.state,
      expectedNonce: p.nonce,
      idTokenExpected: true,
    });
    const claims = tokens.claims();
    const userinfo = await client.fetchUserInfo(config, tokens.access_token, claims.sub);
    let refreshed = null;
    if (tokens.refresh_token) {
      const r = await client.refreshTokenGrant(config, tokens.refresh_token);
      refreshed = { access_token: r.access_token, refresh_token: r.refresh_token };
    }
    const end = {};
    if (p.post_logout_redirect_uri) {
      end.post_logout_redirect_uri = p.post_logout_redirect_uri;
      end.state = "bye";
    }
    const end_session = client.buildEndSessionUrl(config, { id_token_hint: tokens.id_token, ...end });
    console.log(JSON.stringify({
      claims,
      userinfo,
      refreshed,
      end_session: end_session.href,
      access_token: tokens.access_token,
      id_token: tokens.id_token,
      scope: tokens.scope,
    }));
  } else {
    throw new Error(`unknown command ${command}`);
  }
} catch (e) {
  console.log(JSON.stringify({ error: e.message, code: e.code || null, cause: e.cause ? String(e.cause.message || e.cause) : null }));
  process.exit(1);
}
