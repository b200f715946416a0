-- wrk script of loadtest/limiter-bench.py: GET with `Authorization: Bearer
-- $LATCHKEY_TOKEN` and `X-Forwarded-For` cycling through $CLIENTS addresses
-- (10.x.y.z), so that a server trusting 127.0.0.1 as a proxy sees that many
-- clients. The threads share the addresses out (thread k takes every k-th),
-- so each address comes once per cycle. Every request is formatted the same
-- way whatever $CLIENTS is, so the generator's cost does not vary with it.
-- Prints one machine-readable line at the end.

local token = assert(os.getenv("LATCHKEY_TOKEN"), "LATCHKEY_TOKEN is not set")
local clients = tonumber(os.getenv("CLIENTS") or "1")
local threads = {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

local i, step = 0, 1

function init(args)
  i = id
  step = 2
end

function request()
  local n = i % clients
  i = i + step
  local addr = string.format("10.%d.%d.%d", math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
  return wrk.format("GET", nil, { ["Authorization"] = "Bearer " .. token, ["X-Forwarded-For"] = addr }, nil)
end

function done(summary, latency, requests_)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"p99.9":%d,"max":%d}}\n',
    summary.requests, summary.duration,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
