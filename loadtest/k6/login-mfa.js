// login-mfa: the two-step login of an account with an authenticator app,
// at RATE logins per second (open model): POST /auth/login answers
// 401 MFA_REQUIRED with an mfa_token, then POST /auth/mfa/verify with the
// TOTP code completes it. The goal: P95 of the whole two-step login under
// 10 ms at 100 logins/s on the credential-cache path (the password of a
// recent login is checked against the cache, not argon2).
//
// setup() first logs every account in once, a few at a time (the
// password's argon2 check fills the credential cache; the answers are
// MFA_REQUIRED and the mfa_tokens are left to expire), so that the measured
// phase is the cached path, as the goal names.
//
// Accounts are seeded with one shared TOTP secret (`latchkey users seed
// --totp-secret`, a lab only), and this script computes the codes (RFC 6238
// with k6/crypto). A code is accepted once per account and 30 s step, so
// each iteration takes the next account in turn (the test's iteration
// number): with ACCOUNTS >= RATE x 35 no account logs in twice within a step.
//
// Environment: BASE_URL, TOTP_SECRET (base32), RATE (default 100),
// RAMP_SECONDS (default 10), DURATION_SCALE (default 0.1: a 60 s hold),
// ACCOUNTS (default 4000), SEED_PASSWORD.

import http from 'k6/http';
import crypto from 'k6/crypto';
import exec from 'k6/execution';
import { check, fail } from 'k6';
import { Rate, Trend } from 'k6/metrics';
import {
  BASE_URL, SEED_PASSWORD, TREND_STATS, JSON_HEADERS,
  envNumber, durationScale, rampThenHold, seededEmail, classify, accessToken,
} from './lib/common.js';

const SCALE = durationScale(0.1);
const RATE = Math.max(1, Math.round(envNumber('RATE', 100)));
const RAMP_S = Math.max(0, Math.round(envNumber('RAMP_SECONDS', 10)));
const HOLD_S = Math.max(1, Math.round(600 * SCALE));
const ACCOUNTS = Math.max(1, Math.round(envNumber('ACCOUNTS', 4000)));
const SECRET = __ENV.TOTP_SECRET || fail('TOTP_SECRET (base32) is needed');

const twoStep = new Trend('mfa_login_duration', true);
const loginSuccess = new Rate('login_success');

export const options = {
  setupTimeout: '600s',
  scenarios: {
    logins: rampThenHold(RATE, RAMP_S, HOLD_S, Math.max(10, Math.ceil(RATE / 2)), Math.max(50, RATE * 5)),
  },
  thresholds: {
    // Both requests of a login, added up.
    mfa_login_duration: ['p(95)<10'],
    login_success: ['rate>0.99'],
    checks: ['rate>0.99'],
    'http_req_duration{endpoint:login}': ['max>=0'],
    'http_req_duration{endpoint:mfa_verify}': ['max>=0'],
  },
  summaryTrendStats: TREND_STATS,
};

// RFC 4648 base32 to bytes.
function base32(s) {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
  let bits = 0;
  let value = 0;
  const out = [];
  for (const c of s.replace(/=+$/, '').toUpperCase()) {
    value = (value << 5) | alphabet.indexOf(c);
    bits += 5;
    if (bits >= 8) {
      out.push((value >>> (bits - 8)) & 0xff);
      bits -= 8;
    }
  }
  return new Uint8Array(out).buffer;
}

const KEY = base32(SECRET);

// RFC 6238: HMAC-SHA-1 of the 30 s step, dynamic truncation, 6 digits.
function totp(unixSeconds) {
  const step = Math.floor(unixSeconds / 30);
  const msg = new Uint8Array(8);
  let v = step;
  for (let i = 7; i >= 0; i--) {
    msg[i] = v % 256;
    v = Math.floor(v / 256);
  }
  const hex = crypto.hmac('sha1', KEY, msg.buffer, 'hex');
  const bytes = [];
  for (let i = 0; i < hex.length; i += 2) bytes.push(parseInt(hex.slice(i, i + 2), 16));
  const o = bytes[19] & 0x0f;
  const n = ((bytes[o] & 0x7f) << 24) | (bytes[o + 1] << 16) | (bytes[o + 2] << 8) | bytes[o + 3];
  return String(n % 1000000).padStart(6, '0');
}

// Every account's password once, WARM_PARALLEL at a time (the machine's
// hashing threads), retrying what the server shed.
export function setup() {
  const parallel = Math.max(1, Math.round(envNumber('WARM_PARALLEL', 4)));
  let pending = [];
  for (let i = 1; i <= ACCOUNTS; i++) pending.push(i);
  for (let round = 0; round < 20 && pending.length > 0; round++) {
    const retry = [];
    for (let k = 0; k < pending.length; k += parallel) {
      const chunk = pending.slice(k, k + parallel);
      const answers = http.batch(chunk.map((i) => ['POST', `${BASE_URL}/auth/login`,
        JSON.stringify({ email: seededEmail(i), password: SEED_PASSWORD }),
        { headers: JSON_HEADERS, tags: { name: 'warm-up', endpoint: 'warm-up' } }]));
      answers.forEach((r, j) => { if (r.status !== 401) retry.push(chunk[j]); });
    }
    pending = retry;
  }
  if (pending.length > 0) fail(`${pending.length} accounts could not be warmed up`);
}

export default function () {
  const email = seededEmail(1 + (exec.scenario.iterationInTest % ACCOUNTS));
  const first = http.post(`${BASE_URL}/auth/login`, JSON.stringify({ email, password: SEED_PASSWORD }), {
    headers: JSON_HEADERS,
    tags: { name: 'login', endpoint: 'login' },
  });
  classify(first, [401], { endpoint: 'login' });
  let mfaToken;
  try {
    mfaToken = first.json('mfa_token');
  } catch (_) {
    mfaToken = undefined;
  }
  const stepped = first.status === 401 && typeof mfaToken === 'string';
  check(first, { 'login: 401 MFA_REQUIRED with an mfa_token': () => stepped });
  if (!stepped) {
    loginSuccess.add(false);
    return;
  }
  const second = http.post(`${BASE_URL}/auth/mfa/verify`,
    JSON.stringify({ mfa_token: mfaToken, code: totp(Date.now() / 1000) }), {
      headers: JSON_HEADERS,
      tags: { name: 'mfa_verify', endpoint: 'mfa_verify' },
    });
  classify(second, [200], { endpoint: 'mfa_verify' });
  const ok = second.status === 200 && accessToken(second) !== undefined;
  check(second, { 'mfa verify: 200 with a token pair': () => ok });
  loginSuccess.add(ok);
  if (ok) twoStep.add(first.timings.duration + second.timings.duration);
}
