// stress-mix: the stress test of a reference report, 0 -> 50 -> 100 -> 200
// -> 300 users (a Spring Boot 4 service on PostgreSQL 18 and 2 CPUs, which
// collapsed with 60 s timeouts from about 50 users).
//
// Closed model, as in the reference report: ramping-vus, each level reached
// in 120 s and held 180 s, then 60 s down to 0 (1,260 s, its "21 minutes"),
// every duration multiplied by DURATION_SCALE. Each iteration is one request:
//   80 %  GET  /auth/validate  with this VU's access token
//   10 %  POST /auth/login     as a random seeded account, right password
//   10 %  POST /auth/register  with a fresh email
// then sleeps THINK_TIME seconds (default 1; 0 = as fast as possible).
//
// Each VU logs in once (as seeded account number VU, modulo ACCOUNTS) to get
// its token and again when the token is older than TOKEN_MAX_AGE seconds
// (default 600; access tokens live 900 s), tagged endpoint=token_login so that
// it stays out of the mix's figures. BEARER_COLON (0..1, default 0) is the
// share of validations sent as `Authorization: Bearer: <token>`, the form some
// of the reference report's clients used.
//
// Pass (the reference report's criteria): no response slower than 5 s, no error other
// than deliberate 429 / 503 (counted in throttled_429 and shed_503), and
// validation P99 < 50 ms.
//
// Environment: BASE_URL, DURATION_SCALE (default 0.1, about 2 minutes; 1 =
// the reference report's 21 minutes), THINK_TIME, MAX_VUS (default 300), ACCOUNTS
// (default 1000), SEED_PASSWORD, SEED_EMAIL, TOKEN_MAX_AGE, BEARER_COLON.

import http from 'k6/http';
import { check, sleep } from 'k6';
import {
  BASE_URL, SEED_PASSWORD, TREND_STATS, JSON_HEADERS,
  envNumber, durationScale, rampingVUs, seededEmail, randomSeededEmail, freshEmail, randomHex,
  classify, accessToken,
} from './lib/common.js';

const SCALE = durationScale(0.1);
const THINK_TIME = envNumber('THINK_TIME', 1);
const PEAK = Math.max(1, Math.round(envNumber('MAX_VUS', 300)));
const ACCOUNTS = Math.max(1, Math.round(envNumber('ACCOUNTS', 1000)));
const TOKEN_MAX_AGE_MS = envNumber('TOKEN_MAX_AGE', 600) * 1000;
const BEARER_COLON = envNumber('BEARER_COLON', 0);
// The reference report's levels 50 / 100 / 200 / 300, as fractions of the peak.
const lvl = (n) => Math.max(1, Math.round((n * PEAK) / 300));

export const options = {
  scenarios: {
    mix: rampingVUs(SCALE, [
      [120, lvl(50)], [180, lvl(50)], [120, lvl(100)], [180, lvl(100)],
      [120, lvl(200)], [180, lvl(200)], [120, lvl(300)], [180, lvl(300)], [60, 0],
    ]),
  },
  thresholds: {
    // The reference report's pass criteria.
    http_req_duration: ['max<5000'],
    'http_req_duration{endpoint:validate}': ['p(99)<50'],
    unexpected_errors: ['count<1'],
    // Reporting only.
    'http_req_duration{endpoint:login}': ['max>=0'],
    'http_req_duration{endpoint:register}': ['max>=0'],
    'http_req_duration{endpoint:token_login}': ['max>=0'],
    shed_503: ['count>=0'],
    throttled_429: ['count>=0'],
  },
  summaryTrendStats: TREND_STATS,
};

// Per VU (module state is per VU in k6).
let token = null;
let tokenAt = 0;

function login(email, endpoint) {
  return http.post(`${BASE_URL}/auth/login`, JSON.stringify({ email, password: SEED_PASSWORD }), {
    headers: JSON_HEADERS,
    tags: { name: endpoint, endpoint },
  });
}

function ensureToken() {
  if (token && Date.now() - tokenAt < TOKEN_MAX_AGE_MS) return true;
  const res = login(seededEmail(((__VU - 1) % ACCOUNTS) + 1), 'token_login');
  const t = res.status === 200 ? accessToken(res) : undefined;
  check(res, { 'token login: 200 with a token pair': () => t !== undefined });
  classify(res, [200], { endpoint: 'token_login' });
  if (t) {
    token = t;
    tokenAt = Date.now();
  }
  return t !== undefined;
}

function validate() {
  if (!ensureToken()) return;
  const scheme = Math.random() < BEARER_COLON ? 'Bearer:' : 'Bearer';
  const res = http.get(`${BASE_URL}/auth/validate`, {
    headers: { Authorization: `${scheme} ${token}` },
    tags: { name: 'validate', endpoint: 'validate' },
  });
  check(res, { 'validate: 200': (r) => r.status === 200 });
  if (res.status === 401) token = null; // log in again next time
  classify(res, [200], { endpoint: 'validate' });
}

function loginMix() {
  const res = login(randomSeededEmail(ACCOUNTS), 'login');
  check(res, { 'login: 200 with a token pair': (r) => r.status === 200 && accessToken(r) !== undefined });
  classify(res, [200], { endpoint: 'login' });
}

function register() {
  const res = http.post(
    `${BASE_URL}/auth/register`,
    JSON.stringify({ email: freshEmail('sm'), password: `stress-${randomHex(16)}`, name: 'Load Test' }),
    { headers: JSON_HEADERS, tags: { name: 'register', endpoint: 'register' } },
  );
  check(res, { 'register: 201': (r) => r.status === 201 });
  classify(res, [201], { endpoint: 'register' });
}

export default function () {
  const r = Math.random();
  if (r < 0.8) validate();
  else if (r < 0.9) loginMix();
  else register();
  if (THINK_TIME > 0) sleep(THINK_TIME);
}
