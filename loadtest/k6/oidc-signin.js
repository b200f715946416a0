// An application signing a person in with the authorization code flow, as a
// browser would, against any OpenID Provider (latchkey's hosted pages or
// Keycloak's): `scripts/loadtest oidc-compare` (loadtest/oidc_compare.py)
// runs it against both in one run.
//
// FLOW=signin (a new sign-in, each iteration a new browser):
//   GET the authorization endpoint (S256 PKCE, state, nonce) and follow the
//   provider's redirects to its sign-in page; post the page's form with a
//   password; follow redirects until the application's redirect URI; the
//   code at the token endpoint (client_secret_basic); userinfo with the
//   access token. One password hash per iteration on either provider.
// FLOW=sso (single sign-on of a second application):
//   setup() signs SESSIONS browsers in through APP (as above); each
//   iteration takes one of those browsers' cookies and asks for a code for
//   APP2: the provider answers with a redirect straight back (no page, no
//   password), and the code goes to the token endpoint.
//
// `flow` is one whole iteration's time (every request of the flow, the
// sequence a user waits through); `flow_ok` whether every step answered
// as the protocol says (code, state and issuer, a token response with an
// id_token, userinfo's `sub`). Open model: constant-arrival-rate at RATE
// flows/s for SECS seconds.
//
// Environment: ISSUER (discovery is read from ISSUER/.well-known/...),
// FLOW, RATE, SECS, ACCOUNTS (user1..N@loadtest.latchkey), SEED_PASSWORD,
// APP / APP2 (client ids; secret = SECRET_<id>), REDIRECT_<id> (each
// client's registered redirect URI), SESSIONS (sso), MAX_VUS.

import http from 'k6/http';
import crypto from 'k6/crypto';
import encoding from 'k6/encoding';
import { parseHTML } from 'k6/html';
import { Rate, Trend } from 'k6/metrics';
import { envNumber, SEED_PASSWORD, TREND_STATS } from './lib/common.js';

const ISSUER = (__ENV.ISSUER || 'http://127.0.0.1:8080').replace(/\/+$/, '');
const FLOW = __ENV.FLOW || 'signin';
const RATE = envNumber('RATE', 10);
const SECS = envNumber('SECS', 20);
const ACCOUNTS = envNumber('ACCOUNTS', 100);
const SESSIONS = envNumber('SESSIONS', 50);
const APP = __ENV.APP || 'app1';
const APP2 = __ENV.APP2 || 'app2';
const MAX_HOPS = 10;

if (FLOW !== 'signin' && FLOW !== 'sso') throw new Error(`FLOW must be signin or sso, got ${FLOW}`);

const flow = new Trend('flow', true);
const flowOk = new Rate('flow_ok');

export const options = {
  discardResponseBodies: false,
  summaryTrendStats: TREND_STATS,
  scenarios: {
    [FLOW]: {
      executor: 'constant-arrival-rate',
      // k6 takes whole iterations per time unit: tenths of a flow per second.
      rate: Math.round(RATE * 10),
      timeUnit: '10s',
      duration: `${SECS}s`,
      preAllocatedVUs: Math.min(envNumber('MAX_VUS', 400), Math.max(10, Math.ceil(RATE))),
      maxVUs: envNumber('MAX_VUS', 400),
    },
  },
  setupTimeout: '300s',
};

function client(id) {
  return { id, secret: __ENV[`SECRET_${id}`] || `${id}-secret`, redirect: __ENV[`REDIRECT_${id}`] };
}

function randomUrlSafe(bytes) {
  return encoding.b64encode(crypto.randomBytes(bytes), 'rawurl');
}

function resolve(base, ref) {
  if (/^[a-z][a-z0-9+.-]*:/i.test(ref)) return ref;
  const origin = base.match(/^[a-z]+:\/\/[^/]+/i)[0];
  if (ref.startsWith('/')) return origin + ref;
  return base.replace(/[?#].*$/, '').replace(/[^/]*$/, '') + ref;
}

function query(url) {
  const out = {};
  const q = url.split('#')[0].split('?')[1] || '';
  for (const part of q.split('&')) {
    if (!part) continue;
    const [k, v = ''] = part.split('=');
    out[decodeURIComponent(k)] = decodeURIComponent(v.replace(/\+/g, ' '));
  }
  return out;
}

// A browser's cookies for the one provider it talks to. Kept by hand
// rather than in k6's cookie jar because that jar, like Go's, never sends
// a `Secure` cookie over http, and Keycloak marks its cookies Secure even
// then; a browser sends them to a loopback address (a potentially
// trustworthy origin), and so does this.
class Browser {
  constructor(cookies) {
    this.cookies = Object.assign({}, cookies || {});
  }

  request(method, url, body, params) {
    const headers = Object.assign({}, (params && params.headers) || {});
    const names = Object.keys(this.cookies);
    if (names.length) headers.Cookie = names.map((n) => `${n}=${this.cookies[n]}`).join('; ');
    const res = http.request(method, url, body, {
      headers,
      redirects: 0,
      jar: new http.CookieJar(),
      tags: (params && params.tags) || {},
    });
    for (const name of Object.keys(res.cookies)) {
      for (const c of res.cookies[name]) {
        // k6 gives an unset Expires as a negative time.
        const expired = c.max_age < 0 || (c.expires > 0 && c.expires < Date.now()) || c.value === '';
        if (expired) delete this.cookies[name];
        else this.cookies[name] = c.value;
      }
    }
    return res;
  }

  // Follows the provider's redirects until one points at the application
  // (`redirect`): { res, callback } where callback is that Location, or
  // null when the chain ended on a page of the provider.
  follow(res, redirect) {
    for (let hop = 0; hop < MAX_HOPS; hop++) {
      if (res.status < 300 || res.status > 399) return { res, callback: null };
      const location = resolve(res.url, res.headers.Location || res.headers.location || '');
      if (location.startsWith(redirect)) return { res, callback: location };
      res = this.request('GET', location, null, { tags: { step: 'redirect' } });
    }
    return { res, callback: null };
  }
}

// The sign-in form of the page: its action and fields, with the account's
// address in the field the provider named for it (latchkey `email`,
// Keycloak `username`) and the password in the password field.
function signInForm(res, email) {
  const doc = parseHTML(res.body || '');
  let form = null;
  doc.find('form').each((_, f) => {
    if (!form && f.querySelector('input[type="password"]')) form = f;
  });
  if (!form) return null;
  const fields = {};
  form.querySelectorAll('input').forEach((input) => {
    const name = input.getAttribute('name');
    const type = (input.getAttribute('type') || 'text').toLowerCase();
    if (!name) return;
    if (type === 'password') fields[name] = SEED_PASSWORD;
    else if (type === 'email' || name === 'username') fields[name] = email;
    else if (type === 'hidden') fields[name] = input.getAttribute('value') || '';
  });
  return { action: resolve(res.url, form.getAttribute('action') || res.url), fields };
}

function authorizeUrl(meta, app, challenge, state, nonce) {
  const q = {
    response_type: 'code',
    client_id: app.id,
    redirect_uri: app.redirect,
    scope: 'openid email profile',
    state,
    nonce,
    code_challenge: challenge,
    code_challenge_method: 'S256',
  };
  return meta.authorization_endpoint + '?' + Object.keys(q).map((k) => `${k}=${encodeURIComponent(q[k])}`).join('&');
}

// The code at the token endpoint: the token response, or null.
function exchange(meta, app, callback, state, verifier) {
  const got = query(callback);
  if (!got.code || got.state !== state || (got.iss !== undefined && got.iss !== meta.issuer)) return null;
  const res = http.post(
    meta.token_endpoint,
    { grant_type: 'authorization_code', code: got.code, redirect_uri: app.redirect, code_verifier: verifier },
    {
      headers: { Authorization: `Basic ${encoding.b64encode(`${app.id}:${app.secret}`)}` },
      tags: { step: 'token' },
    },
  );
  if (res.status !== 200) return null;
  const body = res.json();
  return body.id_token && body.access_token ? body : null;
}

// One sign-in of `email` through the pages in `browser`: the token
// response, or null at the first step that did not answer as it should.
function signIn(meta, browser, app, email) {
  const verifier = randomUrlSafe(32);
  const state = randomUrlSafe(16);
  const nonce = randomUrlSafe(16);
  const url = authorizeUrl(meta, app, crypto.sha256(verifier, 'base64rawurl'), state, nonce);
  const page = browser.follow(browser.request('GET', url, null, { tags: { step: 'authorize' } }), app.redirect);
  if (page.callback || page.res.status !== 200) return null;
  const form = signInForm(page.res, email);
  if (!form) return null;
  const posted = browser.request('POST', form.action, form.fields, { tags: { step: 'form' } });
  const back = browser.follow(posted, app.redirect);
  if (!back.callback) return null;
  return exchange(meta, app, back.callback, state, verifier);
}

function discovery() {
  const res = http.get(`${ISSUER}/.well-known/openid-configuration`);
  if (res.status !== 200) throw new Error(`discovery answered ${res.status}`);
  return res.json();
}

function account(i) {
  return `user${(i % ACCOUNTS) + 1}@loadtest.latchkey`;
}

export function setup() {
  const meta = discovery();
  const sessions = [];
  if (FLOW === 'sso') {
    const app = client(APP);
    for (let i = 0; i < SESSIONS; i++) {
      const browser = new Browser();
      if (!signIn(meta, browser, app, account(i))) throw new Error(`setup: sign-in ${i} failed`);
      sessions.push(browser.cookies);
    }
  }
  return { meta, sessions };
}

// This virtual user's signed-in browser (sso): one of setup's.
let vuBrowser = null;

function sessionBrowser(data) {
  if (!vuBrowser) vuBrowser = new Browser(data.sessions[(__VU - 1) % data.sessions.length]);
  return vuBrowser;
}

function signInIteration(meta) {
  const tokens = signIn(meta, new Browser(), client(APP), account(__ITER * 997 + __VU));
  if (!tokens) return false;
  const info = http.get(meta.userinfo_endpoint, {
    headers: { Authorization: `Bearer ${tokens.access_token}` },
    tags: { step: 'userinfo' },
  });
  return info.status === 200 && !!info.json().sub;
}

function ssoIteration(data) {
  const browser = sessionBrowser(data);
  const app = client(APP2);
  const verifier = randomUrlSafe(32);
  const state = randomUrlSafe(16);
  const url = authorizeUrl(data.meta, app, crypto.sha256(verifier, 'base64rawurl'), state, randomUrlSafe(16));
  const back = browser.follow(browser.request('GET', url, null, { tags: { step: 'authorize' } }), app.redirect);
  return !!back.callback && !!exchange(data.meta, app, back.callback, state, verifier);
}

export default function (data) {
  const t0 = Date.now();
  const ok = FLOW === 'signin' ? signInIteration(data.meta) : ssoIteration(data);
  flow.add(Date.now() - t0);
  flowOk.add(ok);
}
