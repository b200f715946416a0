// node-oidc-provider, an OpenID Provider certified for the Basic, RP-Initiated
// Logout and Back-Channel Logout plans, run on loopback beside latchkey with
// the equivalent configuration (tests/it/conformance.rs compares the two):
// the authorization code flow with PKCE (S256, required), the scopes openid,
// profile (name), email (email, email_verified) and offline_access,
// RP-initiated and back-channel logout, no claims parameter, requests by
// POST too. Its development
// sign-in pages accept any login: the account is the login given, its email
// that login (verified, unless the login starts with "unverified"; one that
// starts with "mfa" asserts amr ["pwd", "mfa"]).
//
//   node op.mjs '{"clients": [{"client_id","client_secret","redirect_uris",
//                 "post_logout_redirect_uris"?}], "post"?: false}'
//   listens on a free loopback port, prints "ready <issuer>", ends with its
//   input (stdin closed) or on SIGTERM.
import http from "node:http";
import Provider from "oidc-provider";

const p = JSON.parse(process.argv[2]);
const post = p.post !== false;
const server = http.createServer();
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients: p.clients.map((c) => ({
    grant_types: ["authorization_code", "refresh_token"],
    response_types: ["code"],
    ...c,
  })),
  responseTypes: ["code"],
  pkce: { required: () => true },
  scopes: ["openid", "offline_access", "email", "profile"],
  // amr with openid: in the id_token when a sign-in asserts it (below).
  claims: { openid: ["sub", "amr"], email: ["email", "email_verified"], profile: ["name"] },
  features: {
    devInteractions: { enabled: true },
    rpInitiatedLogout: { enabled: true },
    backchannelLogout: { enabled: true },
    claimsParameter: { enabled: false },
  },
  findAccount: async (_ctx, id) => ({
    accountId: id,
    async claims() {
      // A login that starts with "unverified" has an address its owner
      // never confirmed (for the federation tests).
      return { sub: id, email: id, email_verified: !id.startsWith("unverified") };
    },
  }),
  // A refresh token with offline_access, as latchkey gives one.
  issueRefreshToken: async (_ctx, client, code) =>
    client.grantTypeAllowed("refresh_token") && code.scopes.has("offline_access"),
  // Authorization and logout requests by form POST too, as latchkey takes
  // them (Core §3.1.2.1); off by default in node-oidc-provider 9, which
  // then wants its session cookie sent on a cross-site POST (SameSite=None,
  // which a real browser drops without Secure: "post": false for one).
  enableHttpPostMethods: post,
  // Logout tokens go to the tests' receivers on loopback, which its guard
  // against requests to special-use addresses refuses (as latchkey's
  // does unless webhook_allow_private_addresses is set).
  fetch: (url, { dispatcher: _guard, ...options }) => globalThis.fetch(url, options),
  cookies: { keys: ["latchkey-conformance-comparison-only"], ...(post ? { long: { sameSite: "none" } } : {}) },
});

// A login that starts with "mfa" signed in with more than one factor: its
// id_token's amr is ["pwd", "mfa"] (the development sign-in pages assert
// none; for the federation tests of an upstream trusted for its amr). Set
// on the finished interaction before the authorization resumes from it.
provider.use(async (ctx, next) => {
  const resume = ctx.method === "GET" && /^\/auth\/([^/]+)$/.exec(ctx.path);
  if (resume) {
    const interaction = await provider.Interaction.find(resume[1]);
    const login = interaction?.result?.login;
    if (login?.accountId?.startsWith("mfa")) {
      login.amr = ["pwd", "mfa"];
      await interaction.save(interaction.exp - Math.floor(Date.now() / 1000));
    }
  }
  await next();
});

server.on("request", provider.callback());
provider.on("backchannel.error", (_ctx, err) => console.error("backchannel.error", err));
console.log(`ready ${issuer}`);
// The test reads the one line above; the provider's notices go to stderr.
console.log = console.info = console.warn = console.error;
process.on("SIGTERM", () => process.exit(0));
// The test holds stdin open while it needs the provider.
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
