-- wrk script for validate-throughput: sends GET with
-- `Authorization: Bearer <token>` when a token is given, nothing otherwise
-- (so the same script serves /health/live), and prints one machine-readable
-- line at the end for scripts/loadtest (report.lua).
--
--   LATCHKEY_TOKEN=eyJ... wrk -t2 -c50 -d10s --latency -s loadtest/wrk/validate.lua \
--       http://127.0.0.1:8080/auth/validate
--   LATCHKEY_TOKEN_FILE=path/to/token  (read instead, first line)
--   LATCHKEY_BEARER_SCHEME=Bearer:     (a non-standard form some clients send; default Bearer)

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

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or ""
dofile(here .. "report.lua")

-- No response() callback: it makes wrk parse every response in Lua, which
-- costs the load generator CPU; summary.errors.status already counts the
-- responses that were not 2xx/3xx.
