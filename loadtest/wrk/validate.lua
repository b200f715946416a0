-- wrk script for validate-throughput (seed 004): sends GET with
-- `Authorization: Bearer <token>` when a token is given, nothing otherwise
-- (so the same script serves /health/live), and prints one machine-readable
-- line at the end for scripts/loadtest.
--
--   LATCHKEY_TOKEN=eyJ... wrk -t2 -c50 -d10s --latency -s loadtest/wrk/validate.lua \
--       http://127.0.0.1:8080/auth/validate
--   LATCHKEY_TOKEN_FILE=path/to/token  (read instead, first line)
--   LATCHKEY_BEARER_SCHEME=Bearer:     (seed 003's non-standard form; default Bearer)

local function read_token()
  local t = os.getenv("LATCHKEY_TOKEN")
  if t and t ~= "" then
    return t
  end
  local path = os.getenv("LATCHKEY_TOKEN_FILE")
  if path and path ~= "" then
    local f = assert(io.open(path, "r"))
    local line = f:read("*l")
    f:close()
    return line
  end
  return nil
end

local token = read_token()
if token then
  token = token:gsub("%s+$", "")
  local scheme = os.getenv("LATCHKEY_BEARER_SCHEME") or "Bearer"
  wrk.headers["Authorization"] = scheme .. " " .. token
end

-- No response() callback: it makes wrk parse every response in Lua, which
-- costs the load generator CPU; summary.errors.status already counts the
-- responses that were not 2xx/3xx.

function done(summary, latency, requests)
  local e = summary.errors
  -- Latencies are in microseconds.
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"mean":%.1f,"stdev":%.1f,"max":%d,' ..
    '"p50":%d,"p75":%d,"p90":%d,"p99":%d,"p99.9":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.stdev, latency.max,
    latency:percentile(50), latency:percentile(75), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9)))
end
