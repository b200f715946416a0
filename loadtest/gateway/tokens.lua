-- wrk script of the gateway benchmark: GET with `Authorization: Bearer <t>`,
-- cycling through the tokens in $TOKENS_FILE (one per line; the requests
-- are built once, so the generator spends no Lua time per request on them),
-- and one machine-readable line at the end for run.py.

local requests = {}
local path = os.getenv("TOKENS_FILE")
for line in io.lines(path) do
  line = line:gsub("%s+$", "")
  if #line > 0 then
    -- wrk adds no Host to requests formatted before it starts, and an
    -- HTTP/1.1 request without one is refused (RFC 9112 §3.2).
    requests[#requests + 1] = wrk.format("GET", nil, { ["Host"] = "gateway.bench", ["Authorization"] = "Bearer " .. line }, nil)
  end
end
assert(#requests > 0, "no tokens in " .. tostring(path))

local i = 0
function request()
  i = i + 1
  return requests[(i % #requests) + 1]
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
