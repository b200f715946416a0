-- wrk script of the limiter benchmark (loadtest/limiter_bench.py): GET with
-- `Authorization: Bearer $LATCHKEY_TOKEN` and `X-Forwarded-For` cycling
-- through $CLIENTS addresses (10.x.y.z), so that a server trusting
-- 127.0.0.1 as a proxy sees that many clients. The threads share the
-- addresses out (thread k takes every k-th), so each address comes once per
-- cycle. Every request is formatted the same way whatever $CLIENTS is, so
-- the generator's cost does not vary with it.
-- Prints one machine-readable line at the end (report.lua).

local token = assert(os.getenv("LATCHKEY_TOKEN"), "LATCHKEY_TOKEN is not set")
local clients = tonumber(os.getenv("CLIENTS") or "1")
local threads = {}

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or ""
dofile(here .. "report.lua")

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
