-- wrk script: POST /auth/login for user1 ... userN@loadtest.latchkey (the
-- seeded accounts, `latchkey users seed`), each connection walking the
-- accounts from its own offset, and the WRKJSON line of report.lua.
--
--   LATCHKEY_ACCOUNTS=100 wrk -t2 -c50 -d10s --latency -s loadtest/wrk/login.lua \
--       http://127.0.0.1:8080/auth/login
--   LATCHKEY_PASSWORD (default loadtest-password)

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or ""
dofile(here .. "report.lua")

local accounts = tonumber(os.getenv("LATCHKEY_ACCOUNTS") or "100")
local password = os.getenv("LATCHKEY_PASSWORD") or "loadtest-password"
local counter = 0

function setup(thread)
  thread:set("offset", counter * 7919)
  counter = counter + 1
end

local n = 0
function request()
  n = n + 1
  local i = ((offset or 0) + n) % accounts + 1
  local body = string.format('{"email":"user%d@loadtest.latchkey","password":"%s"}', i, password)
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
