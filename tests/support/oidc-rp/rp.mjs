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
//   node rp.mjs logout-token '{"issuer","base","client_id","logout_token","alg"?}'
//     -> {"claims"}: the token validated as Back-Channel Logout 1.0 §2.6
//        tells a relying party to (jose, the JWT library openid-client uses)
//
// `base`: where latchkey really listens; the issuer is a name the tests
// give it (http://latchkey.test), and every request to the issuer's origin
// goes to `base` instead (the library's own customFetch hook).
//
// On any error of the library (an id_token it refuses, a wrong iss, a
// state or nonce mismatch, ...) it prints {"error", "code"} and exits 1.
import * as client from "openid-client";
import * as jose from "jose";

const [command, input] = process.argv.slice(2);
const p = JSON.parse(input);

async function configuration() {
  const metadata = {
    id_token_signed_response_alg: p.id_token_alg || "EdDSA",
  };
  if (p.client_secret) metadata.client_secret = p.client_secret;
  // client_secret_basic unless `auth` is "post" (client_secret_post).
  const auth = !p.client_secret
    ? client.None()
    : p.auth === "post"
      ? client.ClientSecretPost(p.client_secret)
      : client.ClientSecretBasic(p.client_secret);
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

// Back-Channel Logout 1.0 §2.6: the signature by a key of the issuer's
// JWKS, iss, aud, iat (and exp), the explicit type logout+jwt (§4.1),
// the logout event as a member of `events`, a `sid` or a `sub`, no nonce.
async function validateLogoutToken(config) {
  const meta = config.serverMetadata();
  if (meta.backchannel_logout_supported !== true) throw new Error("backchannel_logout_supported is not true");
  const jwksUrl = new URL(meta.jwks_uri);
  const issuer = new URL(p.issuer).origin;
  const jwks = jose.createRemoteJWKSet(new URL(p.base + jwksUrl.href.slice(issuer.length)));
  const { payload, protectedHeader } = await jose.jwtVerify(p.logout_token, jwks, {
    issuer: meta.issuer,
    audience: p.client_id,
    typ: "logout+jwt",
    // As an id_token of this client is (its registered algorithm).
    algorithms: [p.alg || "EdDSA"],
    requiredClaims: ["iat", "jti"],
  });
  const event = payload.events && payload.events["http://schemas.openid.net/event/backchannel-logout"];
  if (typeof event !== "object" || event === null || Array.isArray(event)) throw new Error("no back-channel logout event");
  if (!payload.sid && !payload.sub) throw new Error("neither sid nor sub");
  if ("nonce" in payload) throw new Error("a nonce: this could pass for an id_token");
  return { claims: payload, header: protectedHeader };
}

try {
  const config = await configuration();
  if (command === "logout-token") {
    console.log(JSON.stringify(await validateLogoutToken(config)));
  } else if (command === "start") {
    const code_verifier = client.randomPKCECodeVerifier();
    const code_challenge = await client.calculatePKCECodeChallenge(code_verifier);
    const state = client.randomState();
    // `no_nonce`: a request without one (the code flow does not need it).
    const nonce = p.no_nonce ? undefined : client.randomNonce();
    const params = {
      redirect_uri: p.redirect_uri,
      scope: p.scope || "openid email profile",
      code_challenge,
      code_challenge_method: "S256",
      state,
      ...(p.extra || {}),
    };
    if (nonce) params.nonce = nonce;
    const url = client.buildAuthorizationUrl(config, params);
    console.log(JSON.stringify({ url: url.href, code_verifier, state, nonce }));
  } else if (command === "finish") {
    const checks = {
      pkceCodeVerifier: p.code_verifier,
      expectedState: p.state,
      expectedNonce: p.nonce || undefined,
      idTokenExpected: true,
    };
    // `max_age`: the library checks auth_time against it (Core §3.1.2.1).
    if (p.max_age !== undefined) checks.maxAge = p.max_age;
    const tokens = await client.authorizationCodeGrant(config, new URL(p.callback), checks);
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
