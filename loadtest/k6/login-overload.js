// login-overload (docs/performance.md, "Login under load", run 3):
// wrong-password logins at RATE per second (set it to about 3x the measured
// hashing capacity) for 60 s x DURATION_SCALE, while a second scenario
// validates a token at VALIDATE_RATE per second.
//
// Pass: no response slower than 1 s, every answer to a login is either a fast
// 503 OVERLOADED (shed) or a correct 401 INVALID_CREDENTIALS, and validation
// P99 stays under 10 ms although the hashing threads saturate the CPU.
//
// Environment: BASE_URL, RATE (default 360), VALIDATE_RATE (default 200),
// DURATION_SCALE (default 1: 60 s), SEED_EMAIL/SEED_PASSWORD (an account to
// log in once for the token to validate).

import http from 'k6/http';
import { check } from 'k6';
import { Counter, Rate } from 'k6/metrics';
import { BASE_URL, SEED_PASSWORD, TREND_STATS, JSON_HEADERS, envNumber, durationScale, seededEmail, accessToken, errorCode } from './lib/common.js';

const SCALE = durationScale(1);
const RATE = Math.max(1, Math.round(envNumber('RATE', 360)));
const VALIDATE_RATE = Math.max(1, Math.round(envNumber('VALIDATE_RATE', 200)));
const SECONDS = Math.max(5, Math.round(60 * SCALE));

const correct = new Rate('login_answer_correct');
const shed = new Counter('login_shed_503');
const refused = new Counter('login_401');

export const options = {
  scenarios: {
    wrong_passwords: {
      executor: 'constant-arrival-rate',
      rate: RATE,
      timeUnit: '1s',
      duration: `${SECONDS}s`,
      preAllocatedVUs: Math.max(20, RATE),
      maxVUs: RATE * 3,
      exec: 'wrongPassword',
      tags: { endpoint: 'login' },
    },
    validate: {
      executor: 'constant-arrival-rate',
      rate: VALIDATE_RATE,
      timeUnit: '1s',
      duration: `${SECONDS}s`,
      preAllocatedVUs: 20,
      maxVUs: 200,
      exec: 'validate',
      tags: { endpoint: 'validate' },
    },
  },
  thresholds: {
    'http_req_duration{endpoint:login}': ['max<1000'],
    'http_req_duration{endpoint:validate}': ['p(99)<10', 'max<1000'],
    login_answer_correct: ['rate==1'],
    'checks{endpoint:validate}': ['rate>0.999'],
  },
  summaryTrendStats: TREND_STATS,
};

export function setup() {
  const res = http.post(`${BASE_URL}/auth/login`, JSON.stringify({ email: seededEmail(1), password: SEED_PASSWORD }), { headers: JSON_HEADERS });
  const token = accessToken(res);
  if (!token) {
    throw new Error(`setup login failed: ${res.status} ${res.body}`);
  }
  return { token };
}

export function wrongPassword() {
  const i = 1 + Math.floor(Math.random() * 1000);
  const res = http.post(`${BASE_URL}/auth/login`, JSON.stringify({ email: seededEmail(i), password: 'not the password' }), {
    headers: JSON_HEADERS,
    tags: { name: 'login', endpoint: 'login' },
  });
  const code = errorCode(res);
  const ok = (res.status === 401 && code === 'INVALID_CREDENTIALS') ||
    (res.status === 503 && code === 'OVERLOADED' && res.headers['Retry-After'] !== undefined);
  if (res.status === 503) shed.add(1);
  if (res.status === 401) refused.add(1);
  correct.add(ok);
  check(res, { 'login: 401 INVALID_CREDENTIALS or 503 OVERLOADED': () => ok }, { endpoint: 'login' });
}

export function validate(data) {
  const res = http.get(`${BASE_URL}/auth/validate`, {
    headers: { Authorization: `Bearer ${data.token}` },
    tags: { name: 'validate', endpoint: 'validate' },
  });
  check(res, { 'validate: 200': (r) => r.status === 200 }, { endpoint: 'validate' });
}
