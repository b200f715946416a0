-- The last line of every wrk run of loadtest/, for the Python runner
-- (loadtest/runners.py, run_wrk): `WRKJSON {...}` with the requests, the
-- duration, the errors and the latencies (microseconds). The wrk scripts
-- load it with dofile from their own folder, which defines done():
--
--   local here = debug.getinfo(1, "S").source:match("^@(.*/)") or ""
--   dofile(here .. "report.lua")

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"mean":%.1f,"stdev":%.1f,"max":%d,' ..
    '"p50":%d,"p75":%d,"p90":%d,"p95":%d,"p99":%d,"p99.9":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.stdev, latency.max,
    latency:percentile(50), latency:percentile(75), latency:percentile(90), latency:percentile(95),
    latency:percentile(99), latency:percentile(99.9)))
end
