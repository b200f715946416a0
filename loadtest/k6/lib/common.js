// Shared by the k6 scenarios in loadtest/k6/: settings from the environment,
// the seeded accounts, fresh emails, and the classification of responses.
//
// Environment (every scenario):
//   BASE_URL        the service, default http://127.0.0.1:8080
//   DURATION_SCALE  1 = the full form (the reference report's durations);
//                   each scenario has its own everyday default (see the
//                   scenario's header)
//   SEED_PASSWORD   password of the seeded accounts (`latchkey users seed`)
//   SEED_EMAIL      pattern of the seeded accounts, `{}` = the number from 1

import { Counter } from 'k6/metrics';

export const BASE_URL = (__ENV.BASE_URL || 'http://127.0.0.1:8080').replace(/\/+$/, '');
export const SEED_PASSWORD = __ENV.SEED_PASSWORD || 'loadtest-password';
const SEED_EMAIL = __ENV.SEED_EMAIL || 'user{}@loadtest.latchkey';

// Every trend statistic the reports use (the reference login report's
// table: P50 to max).
export const TREND_STATS = ['count', 'avg', 'min', 'med', 'p(50)', 'p(75)', 'p(90)', 'p(95)', 'p(99)', 'p(99.9)', 'max'];

export function envNumber(name, fallback) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isFinite(n) || n < 0) throw new Error(`${name} must be a non-negative number, got ${JSON.stringify(raw)}`);
  return n;
}

export function durationScale(everydayDefault) {
  const s = envNumber('DURATION_SCALE', everydayDefault);
  if (s <= 0) throw new Error('DURATION_SCALE must be > 0');
  return s;
}

// Seconds, scaled and rounded to whole seconds (at least 1), as a k6 duration.
export function scaled(seconds, scale) {
  return `${Math.max(1, Math.round(seconds * scale))}s`;
}

// A closed-model scenario: `ramping-vus` from 0 VUs through `steps`, each
// [seconds, target VUs], every duration multiplied by `scale`.
export function rampingVUs(scale, steps) {
  return {
    executor: 'ramping-vus',
    startVUs: 0,
    stages: steps.map(([seconds, target]) => ({ duration: scaled(seconds, scale), target })),
    gracefulRampDown: '10s',
    gracefulStop: '10s',
  };
}

// An open-model scenario: arrivals ramp from 0 to `rate` a second over
// `rampS` seconds (none when 0), then hold `rate` for `holdS` seconds.
export function rampThenHold(rate, rampS, holdS, preAllocatedVUs, maxVUs) {
  return {
    executor: 'ramping-arrival-rate',
    startRate: 0,
    timeUnit: '1s',
    preAllocatedVUs,
    maxVUs,
    stages: [
      ...(rampS > 0 ? [{ duration: `${rampS}s`, target: rate }] : []),
      { duration: `${holdS}s`, target: rate },
    ],
    gracefulStop: '10s',
  };
}

export function seededEmail(i) {
  return SEED_EMAIL.replace('{}', String(i));
}

// One of the first `n` seeded accounts, uniformly.
export function randomSeededEmail(n) {
  return seededEmail(1 + Math.floor(Math.random() * n));
}

function randomHex(len) {
  let s = '';
  while (s.length < len) s += Math.floor(Math.random() * 0x100000000).toString(16).padStart(8, '0');
  return s.slice(0, len);
}

// An address no earlier request has used: VU, iteration, time and randomness.
export function freshEmail(prefix) {
  return `${prefix}-${__VU}-${__ITER}-${Date.now().toString(36)}-${randomHex(8)}@loadtest.latchkey`;
}

export { randomHex };

export const JSON_HEADERS = { 'Content-Type': 'application/json' };

// Deliberate refusals are counted on their own, so that a run can tell
// load shedding (503 OVERLOADED) and throttling (429) from real errors.
export const shed503 = new Counter('shed_503');
export const throttled429 = new Counter('throttled_429');
export const unexpectedErrors = new Counter('unexpected_errors');

// Counts the response in the counters above. `expected` lists the statuses
// the request is meant to get; returns true when it got one of them.
export function classify(res, expected, tags) {
  if (expected.includes(res.status)) return true;
  if (res.status === 503) shed503.add(1, tags);
  else if (res.status === 429) throttled429.add(1, tags);
  else unexpectedErrors.add(1, Object.assign({ status: String(res.status) }, tags || {}));
  return false;
}

export function errorCode(res) {
  try {
    const body = res.json();
    return body && typeof body === 'object' ? body.error : undefined;
  } catch (_) {
    return undefined;
  }
}

export function accessToken(res) {
  try {
    const body = res.json();
    return body && typeof body.access_token === 'string' ? body.access_token : undefined;
  } catch (_) {
    return undefined;
  }
}
