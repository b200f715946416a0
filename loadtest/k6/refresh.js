// refresh: token rotation at RATE refreshes per second (open model), each
// virtual user rotating its own chain: it logs in on its first iteration
// and from then on presents the refresh token its last refresh returned,
// as a client keeping a session alive does. No two VUs share a chain, so a
// refused refresh is the server's doing, never a reuse the script caused.
//
// The logins are warm-up, not measured: setup() first logs every account in
// once, a few at a time, so that the VUs' own logins take the credential
// cache's path (no argon2) and the measured phase is refreshes alone.
//
// Environment: BASE_URL, RATE (default 1000), RAMP_SECONDS (default 10),
// DURATION_SCALE (default 0.1: a 60 s hold), ACCOUNTS (default 100),
// SEED_PASSWORD. Threshold: P95 of refresh under 200 ms.

import http from 'k6/http';
import { check, fail } from 'k6';
import { Rate } from 'k6/metrics';
import {
  BASE_URL, SEED_PASSWORD, TREND_STATS, JSON_HEADERS,
  envNumber, durationScale, rampThenHold, seededEmail, classify,
} from './lib/common.js';

const SCALE = durationScale(0.1);
const RATE = Math.max(1, Math.round(envNumber('RATE', 1000)));
const RAMP_S = Math.max(0, Math.round(envNumber('RAMP_SECONDS', 10)));
const HOLD_S = Math.max(1, Math.round(600 * SCALE));
const ACCOUNTS = Math.max(1, Math.round(envNumber('ACCOUNTS', 100)));

const refreshSuccess = new Rate('refresh_success');

export const options = {
  setupTimeout: '300s',
  scenarios: {
    refreshes: rampThenHold(RATE, RAMP_S, HOLD_S, Math.max(20, Math.ceil(RATE / 10)), Math.max(100, RATE)),
  },
  thresholds: {
    'http_req_duration{endpoint:refresh}': ['p(95)<200'],
    refresh_success: ['rate>0.99'],
    'http_req_duration{endpoint:login}': ['max>=0'],
  },
  summaryTrendStats: TREND_STATS,
};

// Every account's password once, 4 at a time (the credential cache).
export function setup() {
  for (let k = 1; k <= ACCOUNTS; k += 4) {
    const chunk = [];
    for (let i = k; i < Math.min(k + 4, ACCOUNTS + 1); i++) chunk.push(i);
    const answers = http.batch(chunk.map((i) => ['POST', `${BASE_URL}/auth/login`,
      JSON.stringify({ email: seededEmail(i), password: SEED_PASSWORD }),
      { headers: JSON_HEADERS, tags: { name: 'warm-up', endpoint: 'warm-up' } }]));
    answers.forEach((r, j) => { if (r.status !== 200) fail(`warm-up login of account ${chunk[j]}: ${r.status}`); });
  }
}

let refreshToken; // this VU's chain

function login() {
  const r = http.post(`${BASE_URL}/auth/login`,
    JSON.stringify({ email: seededEmail(1 + (__VU % ACCOUNTS)), password: SEED_PASSWORD }),
    { headers: JSON_HEADERS, tags: { name: 'login', endpoint: 'login' } });
  if (classify(r, [200], { endpoint: 'login' })) refreshToken = r.json('refresh_token');
}

export default function () {
  if (!refreshToken) {
    login();
    return;
  }
  const r = http.post(`${BASE_URL}/auth/refresh`, JSON.stringify({ refresh_token: refreshToken }),
    { headers: JSON_HEADERS, tags: { name: 'refresh', endpoint: 'refresh' } });
  const ok = classify(r, [200], { endpoint: 'refresh' });
  refreshSuccess.add(ok);
  check(r, { 'refresh: 200 and a new refresh token': () => ok });
  if (ok) refreshToken = r.json('refresh_token');
  else if (r.status === 401) refreshToken = undefined; // the chain ended: log in again
}
