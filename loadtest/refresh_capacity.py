"""Refresh capacity with a generator that costs little: `POST /auth/refresh`
driven by wrk (loadtest/wrk/refresh.lua: every request rotates a token
nobody presented yet, and its answer's token is rotated next), as a share
of a bare axum handler (examples/bare_handler.rs) measured in the same
interleaved rounds, with the CPU each refresh costs the service, the
database (PostgreSQL and Redis, or nothing else on the embedded backend)
and the generator. One k6 run of loadtest/k6/refresh.js at a fixed rate
adds what k6 itself spends per refresh, so that the k6 scenario's ceiling
on this machine can be computed from the same run.

Usage (from the repository root):
  scripts/loadtest refresh-capacity [--backend embedded|postgres] [--secs 8] [--rounds 3]
                                    [--conns 50] [--binary PATH] [--compare OTHER_LATCHKEY_BINARY]
                                    [--k6-rate 1000] [--perf] [--pin]

- builds target/release/latchkey and the bare handler when they are stale;
- postgres: runs again inside scripts/with-services (a throwaway PostgreSQL
  with fsync off, and Redis; the same servers the tests use);
- seeds 2 x CONNS accounts; before each cell of each round, logs each of
  them in once (the credential cache answers all but the first round's
  logins without argon2) for 2 x CONNS fresh chains, so that no cell
  inherits another's tokens;
- wrk -t2 -cCONNS for SECS per cell, the cells (bare, refresh, and
  refresh-other with --compare) interleaved round by round; per cell the
  median of the rounds, and each round's share of the bare handler of the
  same round. A closed loop at saturation: the rate is the most the
  machine answers with these CONNS clients, and the latency is what each
  of them waits at that rate;
- CPU per refresh: the server's (/proc), the database's (every process
  named postgres or redis-server, the throwaway servers being the only
  ones under load) and wrk's, each over the cell's requests;
- --k6-rate N (0: skip): after the rounds, loadtest/k6/refresh.js at N
  refreshes/s for SECS x 2 (its own logins and warm-up excluded from the
  count only approximately: they are a few hundred requests), for k6's CPU
  per refresh;
- --perf: after the rounds, one more run of each cell under `perf record`
  (loadtest/profile.py): flame-<cell>.svg, and profile.md, each function's
  own CPU per request, what a refresh pays over the bare handler (and over
  the other build with --compare);
- --pin: the servers (latchkey and the bare handler) on CPU 0 and the
  generators (wrk with one thread, and k6) on CPU 1 (taskset); the
  databases are not pinned, their CPU is reported apart as always;
- writes report.md and summary.json to
  loadtest/results/<date>-refresh-capacity[-postgres]/.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from . import common, profile
from .common import ROOT, RunError, cpu_seconds, http, processes_named, say
from .overhead import ensure_bare
from .runners import run_k6, run_wrk
from .servers import SEED_PASSWORD, Backend, Procs, Server, seed_users, server_env
from .tools import ensure_binary, find_k6, find_wrk

LUA = ROOT / "loadtest" / "wrk" / "refresh.lua"
BARE_LUA = ROOT / "loadtest" / "wrk" / "validate.lua"
K6_SCRIPT = ROOT / "loadtest" / "k6" / "refresh.js"
INNER_ENV = "LATCHKEY_REFRESH_CAPACITY_INNER"
DATABASE_PROCESSES = {"postgres", "redis-server"}
# The refresh capacity asked of latchkey, as a share of the bare handler
# (docs/performance.md, "Refresh").
GOAL_SHARE = 0.062


def database_cpu():
    return sum(cpu_seconds(pid) for pid, _ in processes_named(DATABASE_PROCESSES))


def fresh_chains(base, accounts, path):
    """One login per account: a file of fresh refresh tokens, one a line."""
    tokens = []
    for i in range(1, accounts + 1):
        status, body = http("POST", f"{base}/auth/login",
                            {"email": f"user{i}@loadtest.latchkey", "password": SEED_PASSWORD}, timeout=30)
        if status != 200:
            raise RunError(f"login of user{i}@loadtest.latchkey: {status} {body[:200]!r}")
        tokens.append(json.loads(body)["refresh_token"])
    path.write_text("\n".join(tokens) + "\n")


def chains_of(log):
    m = re.search(r"^WRKCHAINS (\{.*\})$", log.read_text(errors="replace"), re.M)
    return json.loads(m.group(1)) if m else {"broken_chains": None, "dry_requests": None}


def refresh_cell(server, args, raw, tmp, name, tokens=None):
    """One wrk run of refresh.lua against `server`, with its CPU figures;
    `tokens`: a file of fresh chains made beforehand (else made here)."""
    if tokens is None:
        tokens = Path(tmp) / f"tokens-{name}.txt"
        fresh_chains(server.base_url, 2 * args.conns, tokens)
    s0, d0 = cpu_seconds(server.proc.pid), database_cpu()
    log = raw / f"wrk-{name}.txt"
    threads = common.wrk_threads()
    w = run_wrk(f"{server.base_url}/auth/refresh", LUA, args.conns, args.secs, log, threads=threads,
                env={**os.environ, "LATCHKEY_TOKENS_FILE": str(tokens), "LATCHKEY_THREADS": str(threads)})
    n = max(1, w["requests"])
    secs = w["duration_us"] / 1e6
    w["cpu_us"] = (cpu_seconds(server.proc.pid) - s0) * 1e6 / n
    w["db_cpu_us"] = (database_cpu() - d0) * 1e6 / n
    w["wrk_cpu_us"] = w["generator_cores"] * secs * 1e6 / n
    w.update(chains_of(log))
    return w


def k6_cost(server, args, outdir, raw):
    """k6's CPU per refresh at --k6-rate: refresh.js for 2 x SECS."""
    hold = 2 * args.secs
    env_vars = {"BASE_URL": server.base_url, "RATE": str(args.k6_rate), "RAMP_SECONDS": "2",
                "DURATION_SCALE": f"{hold / 600:.6f}", "ACCOUNTS": str(2 * args.conns),
                "SEED_PASSWORD": SEED_PASSWORD}
    r = run_k6(K6_SCRIPT, env_vars, summary=raw / "k6-summary.json", log=raw / "k6.log", quiet=True,
               announce=f"k6 at {args.k6_rate}/s for {hold} s, for its own CPU per refresh")
    metrics = (r["summary"] or {}).get("metrics", {})
    total = (metrics.get("http_reqs") or {}).get("count", 0)
    ok = (metrics.get("refresh_success") or {}).get("passes", 0)
    p95 = (metrics.get("http_req_duration{endpoint:refresh}") or {}).get("p(95)")
    if not total:
        raise RunError(f"k6 made no request (exit {r['rc']}); see {raw / 'k6.log'}")
    return {"requests": total, "refreshes": ok, "cpu_s": r["cpu_seconds"],
            "cpu_us": r["cpu_seconds"] * 1e6 / total, "p95_ms": p95, "rc": r["rc"]}


def reexec_with_services(argv, binaries):
    env = dict(os.environ, **{INNER_ENV: "1", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    inner = [str(ROOT / "scripts" / "with-services"), sys.executable, "-m", "loadtest", "refresh-capacity", *argv,
             "--binary", str(binaries)]
    os.execvpe(inner[0], inner, env)


def main(argv):
    common.set_prog("refresh-capacity")
    ap = argparse.ArgumentParser(prog="scripts/loadtest refresh-capacity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["embedded", "postgres"], default="embedded")
    ap.add_argument("--secs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--binary", help="the latchkey binary (default: target/release/latchkey, built if stale)")
    ap.add_argument("--compare", help="another latchkey binary measured in the same rounds (cell refresh-other)")
    ap.add_argument("--k6-rate", type=int, default=1000, help="k6's refresh.js at this rate after the rounds, "
                                                              "for k6's CPU per refresh (0: skip)")
    ap.add_argument("--perf", action="store_true", help="profile each cell once more: flame graphs, profile.md")
    common.add_pin_option(ap, help="the servers on CPU 0, wrk on CPU 1")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    common.apply_pinning(args)
    latchkey, _ = ensure_binary(args.binary)
    bare = ensure_bare()
    find_wrk()
    if args.k6_rate:
        find_k6()
    if args.perf:
        profile.require_tools()
    if args.backend == "postgres" and not os.environ.get(INNER_ENV):
        reexec_with_services([a for a in argv if a != "--binary" and a != args.binary], latchkey)
    command = "scripts/loadtest refresh-capacity " + shlex.join(
        [a for a in argv if not (os.environ.get(INNER_ENV) and a in ("--binary", str(latchkey)))])
    started = common.utc_now()
    outdir = common.result_dir(started, "refresh-capacity" + ("-postgres" if args.backend == "postgres" else ""),
                               args.out)
    raw = outdir / "raw"
    tmp = tempfile.mkdtemp(prefix="latchkey-refresh-capacity-")
    procs = Procs()
    backend = Backend(args.backend, tmp, started.strftime("%Y-%m-%d-%H%M"))
    other_backend = None
    servers = {}
    results, k6 = {}, None
    try:
        seed_users(latchkey, server_env(backend, 0), 2 * args.conns, password=SEED_PASSWORD, cwd=tmp)
        servers["refresh"] = Server(latchkey, backend, raw)
        if args.compare:
            # Its own database (another build may have another schema),
            # seeded as this one's.
            other_dir = os.path.join(tmp, "other")
            os.makedirs(other_dir, exist_ok=True)
            other_backend = Backend(args.backend, other_dir, started.strftime("%Y-%m-%d-%H%M") + "-other")
            seed_users(args.compare, server_env(other_backend, 0), 2 * args.conns, password=SEED_PASSWORD,
                       cwd=other_dir)
            servers["refresh-other"] = Server(args.compare, other_backend, raw)
        for s in servers.values():
            s.start()
        bport = common.free_port()
        bp = procs.start("bare", common.pinned_server([bare, f"127.0.0.1:{bport}"]), raw / "bare.log")
        bare_url = f"http://127.0.0.1:{bport}/"
        common.wait_until(lambda: http("GET", bare_url, timeout=1)[0] == 200, "bare_handler", proc=bp)
        run_wrk(bare_url, BARE_LUA, args.conns, 2, raw / "wrk-bare-warmup.txt")
        for name, s in servers.items():
            refresh_cell(s, argparse.Namespace(conns=args.conns, secs=2), raw, tmp, f"{name}-warmup")
        for rnd in range(1, args.rounds + 1):
            b0 = cpu_seconds(bp.pid)
            w = run_wrk(bare_url, BARE_LUA, args.conns, args.secs, raw / f"wrk-bare-r{rnd}.txt")
            w["cpu_us"] = (cpu_seconds(bp.pid) - b0) * 1e6 / max(1, w["requests"])
            w["wrk_cpu_us"] = w["generator_cores"] * w["duration_us"] / max(1, w["requests"])
            results.setdefault("bare", []).append(w)
            say(f"round {rnd}, bare: {w['rps']:,.0f} req/s")
            for name, s in servers.items():
                w = refresh_cell(s, args, raw, tmp, f"{name}-r{rnd}")
                results.setdefault(name, []).append(w)
                say(f"round {rnd}, {name}: {w['rps']:,.0f} refreshes/s, P95 {w['latency_us']['p95'] / 1000:.1f} ms, "
                    f"non-200 {w['errors']['status']}, broken chains {w['broken_chains']}; CPU us/refresh: "
                    f"server {w['cpu_us']:.0f}, database {w['db_cpu_us']:.0f}, wrk {w['wrk_cpu_us']:.0f}")
        if args.k6_rate:
            k6 = k6_cost(servers["refresh"], args, outdir, raw)
            say(f"k6: {k6['requests']:,} requests, {k6['cpu_us']:.0f} us of k6's CPU per request")
        if args.perf:
            profiles = {"bare": profile.record(bp.pid, args.secs, lambda: run_wrk(
                bare_url, BARE_LUA, args.conns, args.secs, raw / "wrk-bare-perf.txt")["requests"],
                raw, outdir, "bare", "bare axum handler")}
            for name, s in servers.items():
                # The logins first, so that the profile holds refreshes only.
                tokens = Path(tmp) / f"tokens-{name}-perf.txt"
                fresh_chains(s.base_url, 2 * args.conns, tokens)
                profiles[name] = profile.record(
                    s.proc.pid, args.secs,
                    lambda s=s, name=name, tokens=tokens: refresh_cell(s, args, raw, tmp, f"{name}-perf", tokens)[
                        "requests"], raw, outdir, name, f"latchkey {name} ({args.backend})")
            (outdir / "profile.md").write_text(profile.table(profiles, command, [("refresh", "bare"),
                                                                                 ("refresh", "refresh-other")]))
    finally:
        for s in servers.values():
            s.stop()
        procs.stop_all()
        backend.drop()
        if other_backend:
            other_backend.drop()
        shutil.rmtree(tmp, ignore_errors=True)
    text, summary = report(args, command, started, results, k6)
    (outdir / "report.md").write_text(text)
    (outdir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(text)
    say(f"report: {outdir / 'report.md'}")
    failed = [n for n in servers if any(w["broken_chains"] or w["errors"]["status"] for w in results[n])]
    return 1 if failed else 0


def results_bare_cpu(results):
    return med(results["bare"], lambda w: w["cpu_us"])


def med(rows, key):
    return statistics.median(key(w) for w in rows)


def report(args, command, started, results, k6):
    m = common.machine_info()
    bare_rps = med(results["bare"], lambda w: w["rps"])
    lines = [f"# Refresh capacity ({args.backend}), {started.strftime('%Y-%m-%d %H:%M')} UTC", "",
             f"Command: `{command.strip()}`  ",
             f"Machine: {m['nproc']} CPU ({m['cpu']}), {m['ram_gib']:.0f} GiB, Linux {m['kernel']}  ",
             f"Revision: {common.git_revision()}  ",
             f"wrk -t{common.wrk_threads()} -c{args.conns}, {args.secs} s per cell, {args.rounds} interleaved rounds, medians. "
             f"{common.pinning_note()} Each refresh rotates a fresh token (loadtest/wrk/refresh.lua).", "",
             "| cell | req/s (median) | rounds | share of bare (median of rounds) | P95 ms | P99 ms | non-200 | "
             "broken chains | CPU us/request: server | database | wrk |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    summary = {"bare_rps": bare_rps, "cells": {}, "k6": k6, "pinned": bool(args.pin)}
    for name, rows in results.items():
        shares = [w["rps"] / b["rps"] for w, b in zip(rows, results["bare"])]
        share = statistics.median(shares)
        cell = {"rps": med(rows, lambda w: w["rps"]), "share": share,
                "p95_ms": med(rows, lambda w: w["latency_us"]["p95"]) / 1000,
                "p99_ms": med(rows, lambda w: w["latency_us"]["p99"]) / 1000,
                "non_200": sum(w["errors"]["status"] for w in rows),
                "broken_chains": sum(w.get("broken_chains") or 0 for w in rows),
                "cpu_us": med(rows, lambda w: w["cpu_us"]),
                "db_cpu_us": med(rows, lambda w: w.get("db_cpu_us", 0)),
                "wrk_cpu_us": med(rows, lambda w: w["wrk_cpu_us"]),
                "rounds": [w["rps"] for w in rows]}
        summary["cells"][name] = cell
        label = {"bare": "bare axum handler", "refresh": "latchkey /auth/refresh",
                 "refresh-other": f"other build (`{args.compare}`): /auth/refresh"}[name]
        broken = "-" if name == "bare" else f"{cell['broken_chains']:,}"
        db = "-" if name == "bare" else f"{cell['db_cpu_us']:.0f}"
        lines.append(f"| {label} | {cell['rps']:,.0f} | {', '.join(f'{r:,.0f}' for r in cell['rounds'])} | "
                     f"{share:.4f} | {cell['p95_ms']:.1f} | {cell['p99_ms']:.1f} | {cell['non_200']:,} | {broken} | "
                     f"{cell['cpu_us']:.1f} | {db} | {cell['wrk_cpu_us']:.1f} |")
    r = summary["cells"]["refresh"]
    per = r["cpu_us"] + r["db_cpu_us"]
    goal_rate = GOAL_SHARE * bare_rps
    lines += ["", "## What a refresh costs the machine", "",
              f"- Service and database together: {per:.0f} us of CPU per refresh ({r['cpu_us']:.0f} + "
              f"{r['db_cpu_us']:.0f}); with wrk's {r['wrk_cpu_us']:.0f} us, {per + r['wrk_cpu_us']:.0f} us: "
              f"{m['nproc']} cores allow at most {m['nproc'] * 1e6 / (per + r['wrk_cpu_us']):,.0f} refreshes/s "
              f"with this generator; {r['rps']:,.0f}/s were answered.",
              *([f"- Pinned, the service has one core: at {r['cpu_us']:.0f} us a refresh it allows at most "
                 f"{1e6 / r['cpu_us']:,.0f} refreshes/s, the bare handler's {1e6 / results_bare_cpu(results):,.0f}/s "
                 f"at its {results_bare_cpu(results):.1f} us (the database's CPU is on top, on either core)."]
                if args.pin else []),
              f"- The goal, {GOAL_SHARE} of the bare handler: {goal_rate:,.0f} refreshes/s in this run "
              f"(measured: {r['share']:.4f}, {r['share'] / GOAL_SHARE:.0%} of the goal)."]
    if k6:
        k6_budget = m["nproc"] * 1e6 / goal_rate
        lines += [f"- k6 (loadtest/k6/refresh.js at {args.k6_rate}/s for {2 * args.secs} s, {k6['requests']:,} "
                  f"requests, P95 {k6['p95_ms'] or 0:.1f} ms): {k6['cpu_us']:.0f} us of k6's CPU per request. "
                  f"With k6 as the generator, {m['nproc']} cores allow at most "
                  f"{m['nproc'] * 1e6 / (per + k6['cpu_us']):,.0f} refreshes/s at this service and database "
                  f"cost, and at most {m['nproc'] * 1e6 / k6['cpu_us']:,.0f}/s for k6 alone; the goal's rate "
                  f"leaves {k6_budget:.0f} us of the machine per refresh, "
                  + (f"{k6_budget - k6['cpu_us']:.0f} us of it for service and database."
                     if k6_budget > k6['cpu_us'] else "less than k6 alone takes.")]
    return "\n".join(lines) + "\n", summary
