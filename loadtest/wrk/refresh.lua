-- wrk script: POST /auth/refresh, each request presenting a refresh token
-- that the server issued and nobody has presented yet, so every request is
-- a rotation (never a reuse inside or outside the grace window) and each
-- answer's new token goes on to be rotated again: token chains, as clients
-- keeping their sessions alive make them, at the cost of a few microseconds
-- of the generator per request (k6 spends about 200 us per refresh).
--
--   LATCHKEY_TOKENS_FILE=tokens.txt LATCHKEY_THREADS=2 \
--       wrk -t2 -c50 -d10s --latency -s loadtest/wrk/refresh.lua http://127.0.0.1:8080/auth/refresh
--
-- tokens.txt holds one refresh token a line (fresh logins); thread k of
-- LATCHKEY_THREADS (wrk's -t) takes lines k, k + threads, ... as its pool.
-- A request takes the oldest token of its thread's pool and its answer puts
-- the successor back. A connection has one request in flight, so a pool of
-- more tokens than the thread's connections never runs dry while the chains
-- hold; a chain that breaks (any answer but 200 with a refresh token) is
-- counted in the WRKJSON line's "broken_chains", and a thread whose pool
-- ran dry sends an unusable token, which the server answers 401 (counted in
-- errors.status as well).

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or ""
dofile(here .. "report.lua")

local threads = {}
local counter = 0

function setup(thread)
  thread:set("index", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

local pool, head, tail = {}, 1, 0
broken, dry = 0, 0

function init(args)
  local path = assert(os.getenv("LATCHKEY_TOKENS_FILE"), "LATCHKEY_TOKENS_FILE is not set")
  local every = tonumber(os.getenv("LATCHKEY_THREADS") or "1")
  local n = 0
  for line in io.lines(path) do
    if n % every == index and line ~= "" then
      tail = tail + 1
      pool[tail] = line
    end
    n = n + 1
  end
end

function request()
  local token = "exhausted-pool"
  if head <= tail then
    token = pool[head]
    pool[head] = nil
    head = head + 1
  else
    dry = dry + 1
  end
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"},
                    '{"refresh_token":"' .. token .. '"}')
end

function response(status, headers, body)
  local next_token = status == 200 and body:match('"refresh_token"%s*:%s*"([^"]+)"')
  if next_token then
    tail = tail + 1
    pool[tail] = next_token
  else
    broken = broken + 1
  end
end

-- report.lua's done() with two more fields: chains broken and requests
-- sent without a token, over all threads.
local report_done = done
function done(summary, latency, requests)
  local b, d = 0, 0
  for _, t in ipairs(threads) do
    b = b + (t:get("broken") or 0)
    d = d + (t:get("dry") or 0)
  end
  io.write(string.format('WRKCHAINS {"broken_chains":%d,"dry_requests":%d}\n', b, d))
  report_done(summary, latency, requests)
end
