-- wrk script of the gateway benchmark: GET with `Authorization: Bearer <t>`,
-- cycling through the tokens in $TOKENS_FILE (one per line; the requests
-- are built once, so the generator spends no Lua time per request on them),
-- and one machine-readable line at the end for loadtest/gateway_bench.py
-- (../wrk/report.lua).

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or ""
dofile(here .. "../wrk/report.lua")

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
