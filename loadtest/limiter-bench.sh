#!/bin/bash
# /auth/validate unlimited vs limited by the Redis limiter (one EVALSHA per request), same server otherwise.
: "${LATCHKEY_TEST_REDIS_URL:?run under scripts/with-services, or set it}"
BIN="$(cd "$(dirname "$0")/.." && pwd)/target/release/latchkey"
cd "$(mktemp -d)"
B=http://127.0.0.1:18095
run() {
  LATCHKEY_LISTEN=127.0.0.1:18095 LATCHKEY_LOG=warn LATCHKEY_MAIL=file:./mail LATCHKEY_REDIS_URL=$LATCHKEY_TEST_REDIS_URL \
  LATCHKEY_REDIS_KEY_PREFIX=lb$1: LATCHKEY_RATE_LIMIT_VALIDATE=$2 "$BIN" serve > server-$1.log 2>&1 &
  PID=$!
  sleep 1.5
  curl -s -XPOST $B/auth/register -d "{\"email\":\"lb$1@x.io\",\"password\":\"password123\"}" >/dev/null; sleep 1
  code=$(grep -h -oE '^[0-9]{6}' mail/*.eml | tail -1)
  T=$(curl -s -XPOST $B/auth/verify-otp -d "{\"email\":\"lb$1@x.io\",\"code\":\"$code\"}" | python3 -c 'import json,sys;print(json.load(sys.stdin)["access_token"])')
  wrk -t2 -c50 -d5s -H "Authorization: Bearer $T" $B/auth/validate > /dev/null
  echo "== $1 (rate_limit_validate=$2)"
  wrk -t2 -c50 -d15s --latency -H "Authorization: Bearer $T" $B/auth/validate | grep -E "Requests/sec|50%|99%|Non-2xx"
  kill $PID; wait $PID 2>/dev/null; rm -rf mail data
}
run unlimited off
run redis-limited 1000000000/60
run unlimited2 off
run redis-limited2 1000000000/60
