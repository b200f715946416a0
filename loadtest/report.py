"""The one report writer: reads what the load generators wrote, renders each
family's Markdown report (service scenarios with k6 or wrk, the gateway
benchmark, the limiter benchmark), the row a run adds to its table in
docs/performance.md, and the plot (drawn by loadtest/plot.py)."""

import csv
import gzip
import json
import os
import subprocess
import urllib.parse

from . import common
from .common import NPROC, ROOT, git_revision, machine_info, median, percentile, rel, resource_stats, say
from .tools import plotting_python

DOCS = ROOT / "docs" / "performance.md"

# The figures of the reference reports each service scenario was modelled
# on, in their own words and units (their hardware, not this machine).
REFERENCES = {
    "login-slo": "the reference login report (a Spring Boot service on PostgreSQL + Redis, k6 stages, 10 minutes): "
                 "60,045 requests, 94 RPS, 99.85 % success, P50 38.1 ms, P75 68.5 ms, P90 95.2 ms, P95 120.5 ms, "
                 "P99 185.2 ms, max 195.4 ms; k6 CPU 35 %, 0 dropped iterations; server CPU 45 % avg.",
    "nearyou-flow": "the reference flow report (the sign-up / verify / login flow of a location app in Kotlin, "
                    "PostgreSQL + Redis, BCrypt cost 12; up to 100 virtual users with 1 s think time): 11,884 requests "
                    "in 5.5 min, 35.6 req/s, 2,971 iterations (8.9/s), 0 % system errors, median 5.65 ms, P90 860 ms, "
                    "P95 1.33 s, max 2.23 s; CPU 60-80 % at 100 VUs.",
    "stress-mix": "the reference stress report (a Spring Boot 4 service on PostgreSQL 18, 2 CPUs, 0 -> 300 virtual "
                  "users): 2,903 requests in 21 min, 96.4 % errors, median 60.0 s, P95 60.0 s, max 60 s (timeouts); "
                  "CPU 200 % from 50 VUs; limit ~30-50 VUs.",
    "validate-throughput": "the reference validation report (a Quarkus native service, wrk, 10 cores): JWT validation "
                           "20.1k-21.6k req/s (P99 11.2 ms at 50 connections, 38.0 ms at 150, 61.9 ms at 300); "
                           "health 66.9k-77.1k req/s.",
}


# --------------------------------------------------------------------------
# Formatting


def fmt_ms(v):
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v / 1000:.2f} s"
    if v >= 100:
        return f"{v:.0f} ms"
    if v >= 10:
        return f"{v:.1f} ms"
    return f"{v:.2f} ms"


def fmt_pct(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f} %"


def fmt_num(v, digits=1):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def fmt_avg_max(pair, unit="%"):
    avg, mx = pair
    if avg is None:
        return "-"
    return f"{avg:.0f} {unit} / {mx:.0f} {unit}"


def scale_text(scale):
    return "the script's default" if scale is None else f"{scale:g}"


def request_table(rows):
    lines = [
        "| requests | count | RPS | success | P50 | P75 | P90 | P95 | P99 | max | 429 | 503 | other errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if not r["count"]:
            continue
        lines.append(
            f"| {r['label']} | {r['count']:,} | {fmt_num(r['rps'])} | {fmt_pct(r['success'])} | "
            f"{fmt_ms(r['p50'])} | {fmt_ms(r['p75'])} | {fmt_ms(r['p90'])} | {fmt_ms(r['p95'])} | "
            f"{fmt_ms(r['p99'])} | {fmt_ms(r['max'])} | {r['s429']} | {r['s503']} | {r['other']} |"
        )
    return lines


def finish(outdir, report, summary=None):
    """Writes report.md (and summary.json) to the result folder and prints the report."""
    (outdir / "report.md").write_text(report)
    if summary is not None:
        (outdir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(report, flush=True)
    say(f"report: {rel(outdir / 'report.md')}")


# --------------------------------------------------------------------------
# k6 results


class Group:
    """The requests of one row of the report: durations and answers."""

    def __init__(self, label):
        self.label = label
        self.durations = []
        self.ok = 0
        self.s429 = 0
        self.s503 = 0
        self.other = 0
        self.first = None
        self.last = None

    def add(self, t_ms, value, status, expected):
        self.durations.append(value)
        if expected:
            self.ok += 1
        elif status == "429":
            self.s429 += 1
        elif status == "503":
            self.s503 += 1
        else:
            self.other += 1
        self.first = t_ms if self.first is None else min(self.first, t_ms)
        self.last = t_ms if self.last is None else max(self.last, t_ms)

    def row(self, run_seconds=None):
        d = sorted(self.durations)
        n = len(d)
        span = run_seconds
        if span is None:
            span = ((self.last - self.first) / 1000 + 1) if n else 0
        return {
            "label": self.label,
            "count": n,
            "rps": n / span if span else 0,
            "success": self.ok / n * 100 if n else None,
            "p50": percentile(d, 50),
            "p75": percentile(d, 75),
            "p90": percentile(d, 90),
            "p95": percentile(d, 95),
            "p99": percentile(d, 99),
            "max": d[-1] if d else None,
            "s429": self.s429,
            "s503": self.s503,
            "other": self.other,
        }


def parse_tags(extra):
    if not extra:
        return {}
    return dict(urllib.parse.parse_qsl(extra, keep_blank_values=True))


def analyse_k6_csv(path, group_tag, group_order, focus=None):
    """Per-group rows and a per-second time series from k6's CSV output.
    `focus` names one group whose P99 gets its own column in the series."""
    groups = {"all": Group("all requests")}
    dynamic = group_order is None
    for key, label in group_order or []:
        groups[key] = Group(label)
    per_sec = {}
    focus_sec = {}
    vus = {}
    with gzip.open(path, "rt", newline="") as f:
        for rec in csv.DictReader(f):
            name = rec["metric_name"]
            if name == "vus":
                vus[int(float(rec["timestamp"])) // 1000] = float(rec["metric_value"])
                continue
            if name != "http_req_duration":
                continue
            t_ms = int(float(rec["timestamp"]))
            v = float(rec["metric_value"])
            status = rec.get("status", "")
            expected = rec.get("expected_response", "") == "true"
            tags = parse_tags(rec.get("extra_tags", ""))
            groups["all"].add(t_ms, v, status, expected)
            key = tags.get(group_tag)
            if dynamic and key and key != "all" and key not in groups:
                groups[key] = Group(key)
            if key in groups and key != "all":
                groups[key].add(t_ms, v, status, expected)
            sec = t_ms // 1000
            b = per_sec.setdefault(sec, [[], 0])
            b[0].append(v)
            if not expected:
                b[1] += 1
            if focus and key == focus:
                focus_sec.setdefault(sec, []).append(v)
    series = []
    last_vus = None
    for sec in sorted(per_sec):
        vals, errs = per_sec[sec]
        vals.sort()
        fv = sorted(focus_sec.get(sec, []))
        last_vus = vus.get(sec, last_vus)
        series.append((sec, len(vals), errs, last_vus, percentile(vals, 50), percentile(vals, 95),
                       percentile(vals, 99), percentile(fv, 99) if fv else None))
    return groups, series


def summary_metric(summary, name):
    return (summary or {}).get("metrics", {}).get(name)


def thresholds_from_summary(summary):
    """[(metric, expression, passed, observed)] from k6's --summary-export."""
    out = []
    for name, m in (summary or {}).get("metrics", {}).items():
        for expr, failed in (m.get("thresholds") or {}).items():
            # The export maps each expression to true when it FAILED.
            stat = expr.split("<")[0].split(">")[0].split("=")[0].strip()
            observed = m.get(stat)
            if observed is None and stat == "rate":
                observed = m.get("value")
            out.append((name, expr, not failed, observed))
    return out


# How the requests of each k6 scenario are grouped into rows; a generic
# script gets one row per `endpoint` tag. `focus`: the group whose P99 the
# time series and the plot show on its own.
K6_GROUPS = {
    "login-slo": ("phase", [("hold", "hold phase"), ("ramp", "ramp phase"),
                            ("warm", "warm-up (WARM=1: each account once, before the ramp)")], None),
    "nearyou-flow": ("endpoint", [("register", "register (201)"), ("login_unverified", "login before verify (401)"),
                                  ("verify_otp_wrong", "verify-otp wrong code (401)"),
                                  ("refresh_bogus", "refresh bogus token (401)")], "register"),
    "stress-mix": ("endpoint", [("validate", "validate (80 %)"), ("login", "login (10 %)"),
                                ("register", "register (10 %)"), ("token_login", "token logins (per VU)")],
                   "validate"),
}


def k6_rows(ctx):
    """The report's rows (all requests first) and the per-second series, which
    also goes to raw/timeseries.csv for the plot."""
    scenario, raw, k6r = ctx["scenario"], ctx["raw"], ctx["k6"]
    group_tag, order, focus = K6_GROUPS.get(scenario, ("endpoint", None, None))
    csv_path = raw / "k6.csv.gz"
    groups, series = ({}, [])
    if csv_path.exists():
        try:
            groups, series = analyse_k6_csv(csv_path, group_tag, order, focus)
        except (OSError, EOFError, ValueError, KeyError) as e:
            say(f"warning: cannot read {csv_path}: {e}")
    http_reqs = summary_metric(k6r["summary"], "http_reqs") or {}
    rows = []
    if groups:
        all_row = groups["all"].row()
        if http_reqs.get("rate"):
            all_row["rps"] = http_reqs["rate"]
        rows.append(all_row)
        rows += [g.row() for k, g in groups.items() if k != "all"]
    with open(raw / "timeseries.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["second", "requests", "errors", "vus", "p50_ms", "p95_ms", "p99_ms",
                    f"{focus}_p99_ms" if focus else "focus_p99_ms"])
        for s in series:
            w.writerow([s[0], s[1], s[2], "" if s[3] is None else f"{s[3]:g}"]
                       + ["" if x is None else f"{x:.3f}" for x in s[4:]])
    return rows


# --------------------------------------------------------------------------
# Service scenarios: k6 and wrk


def write_k6_report(ctx):
    scenario, raw, k6r = ctx["scenario"], ctx["raw"], ctx["k6"]
    summary = k6r["summary"]
    rows = k6_rows(ctx)
    run_seconds = k6r["ended"] - k6r["started"]
    res = resource_stats([r for r in ctx["sampler"].rows if r["gen_active"]])
    dropped = (summary_metric(summary, "dropped_iterations") or {}).get("count", 0)
    iterations = (summary_metric(summary, "iterations") or {}).get("count", 0)
    thresholds = thresholds_from_summary(summary)
    failed = [t for t in thresholds if not t[2]]
    k6_ok = k6r["rc"] == 0
    verdict = "PASS" if k6_ok and not failed else "FAIL"

    lines = [f"# {scenario}: {ctx['date_human']}", ""]
    if k6r["rc"] not in (0, 99):
        lines.append(f"**Result: FAIL** (k6 exited with {k6r['rc']}; see raw/k6.log)")
    elif failed:
        lines.append("**Result: FAIL**, thresholds breached: "
                     + "; ".join(f"`{n}` {e}" for n, e, _, _ in failed))
    else:
        lines.append("**Result: PASS** (every k6 threshold held)")
    lines += ["", f"Backend: {ctx['backend'].kind}. Duration scale {scale_text(ctx['scale'])}"
              f"{' (the full form)' if ctx['scale'] == 1 else ''}; k6 ran {run_seconds:.0f} s.", ""]
    lines += request_table(rows)
    lines += ["", "Success = the response the script expects (for nearyou-flow the 401s are expected). "
              "429 and 503 are deliberate refusals (rate limits off, so 503 = load shedding); other errors "
              "include timeouts and connection failures (status 0).", ""]

    lines += ["| load generation and resources | value |", "|---|---|"]
    lines.append(f"| iterations | {iterations:,} |")
    if scenario == "login-slo":
        rate = float(k6r["env"].get("RATE", 100))
        ramp = float(k6r["env"].get("RAMP_SECONDS", 30))
        hold = max(1, round(600 * ctx["scale"]))
        lines.append(f"| arrivals planned (open model) | {rate * ramp / 2 + rate * hold:,.0f} "
                     f"({rate:g}/s: {ramp:g} s ramp, {hold} s hold) |")
    lines.append(f"| dropped_iterations | {dropped:,} |")
    lines.append(f"| server CPU avg / max | {fmt_avg_max(res['server_cpu'])} (100 % = one core; {NPROC} cores) |")
    lines.append(f"| server RSS max | {fmt_num(res['server_rss'][1])} MiB |")
    lines.append(f"| k6 CPU avg / max | {fmt_avg_max(res['gen_cpu'])} |")
    lines.append(f"| machine CPU avg / max | {fmt_avg_max(res['machine_cpu'])} (everything, incl. PostgreSQL / Redis) |")
    hashes, capacity = ctx["server_metrics"].get("hashes"), ctx.get("hash_capacity")
    if hashes is not None and capacity and ctx.get("k6_seconds"):
        rate = hashes / ctx["k6_seconds"]
        lines.append(f"| server: hashes completed per s (latchkey_hash_seconds_count over the k6 run) | "
                     f"{rate:,.1f} ({rate / capacity:.0%} of the capacity) |")
        lines.append(f"| hashing capacity (`latchkey hash-capacity`, measured before the run) | {capacity:,.1f}/s |")
        windows = sorted(ctx.get("hash_windows") or [])
        if windows:
            med = windows[len(windows) // 2]
            lines.append(f"| server: hashes per s in the {len(windows)} windows of 5 s with hashes waiting "
                         f"(median / lowest) | {med:,.1f} ({med / capacity:.0%}) / {windows[0]:,.1f} "
                         f"({windows[0] / capacity:.0%}) |")
    bare = ctx.get("bare_rps")
    if bare:
        mean = sum(bare) / len(bare)
        lines.append(f"| bare axum handler, wrk -t2 -c50 6 s before / after the k6 run | "
                     f"{' / '.join(f'{b:,.0f}' for b in bare)} req/s |")
        rate = float(k6r["env"].get("RATE", 0))
        held = verdict == "PASS" and dropped <= 0.01 * max(1, iterations)
        if rate and held:
            lines.append(f"| the rate held (every threshold kept, under 1 % dropped) as a share of the bare "
                         f"handler (the mean of the two) | {rate:,.0f} / {mean:,.0f} = **{rate / mean:.4f}** |")
        else:
            lines.append(f"| the rate was not held (a threshold failed, or 1 % or more dropped): no capacity "
                         f"share; offered {rate:,.0f}/s, bare {mean:,.0f} req/s | - |")
    for k, label in (("shed", "server: requests shed (latchkey_http_shed_total)"),
                     ("deadline", "server: deadlines exceeded (latchkey_http_deadline_exceeded_total)")):
        if ctx["server_metrics"].get(k) is not None:
            lines.append(f"| {label} | {ctx['server_metrics'][k]:,.0f} |")
    lines.append("")

    if thresholds:
        lines += ["| k6 threshold | observed | result |", "|---|---:|---|"]
        for name, expr, ok, observed in sorted(thresholds, key=lambda t: (t[2], t[0])):
            if expr in ("max>=0", "rate>=0", "count>=0"):
                continue  # reporting-only thresholds
            if observed is None:
                obs = "-"
            elif "duration" in name:
                obs = fmt_ms(observed)
            elif expr.startswith("rate"):
                obs = fmt_pct(observed * 100)
            else:
                obs = fmt_num(observed, 0)
            lines.append(f"| `{name}` {expr} | {obs} | {'ok' if ok else '**FAILED**'} |")
        lines.append("")

    if scenario in REFERENCES:
        lines += [f"For comparison, {REFERENCES[scenario]}", ""]
    lines += run_details(ctx, [f"k6: {ctx['k6_version']}; environment given to the script: "
                               + ", ".join(f"{k}={v}" for k, v in k6r["env"].items())])
    report = "\n".join(lines) + "\n"

    # The JSON behind the report, for docs and tooling.
    (raw / "report.json").write_text(json.dumps({
        "scenario": scenario, "verdict": verdict, "rows": rows, "dropped_iterations": dropped,
        "iterations": iterations, "resources": res, "thresholds": thresholds, "scale": ctx["scale"],
        "backend": ctx["backend"].kind, "date": ctx["date_iso"], "revision": ctx["revision"],
    }, indent=1, default=str))
    return report, verdict, rows


def step_errors(s):
    return s["non_2xx"] + s["socket_errors"] + s["timeouts"]


def write_wrk_report(ctx):
    scenario, outdir, w = ctx["scenario"], ctx["outdir"], ctx["wrk"]
    steps = w["steps"]
    (outdir / "summary.json").write_text(json.dumps({
        "scenario": scenario, "tool": w["wrk_version"], "step_seconds": w["step_seconds"],
        "threads": w["threads"], "steps": steps}, indent=1))
    errors = sum(step_errors(s) for s in steps)
    verdict = "PASS" if errors == 0 else "FAIL"
    by = {}
    for s in steps:
        by.setdefault(s["connections"], {})[s["endpoint"]] = s
    lines = [f"# {scenario}: {ctx['date_human']}", ""]
    lines.append("**Result: PASS** (no non-2xx response, socket error or timeout)" if verdict == "PASS"
                 else f"**Result: FAIL**: {errors} non-2xx responses, socket errors or timeouts (see raw/wrk.log)")
    lines += ["", f"Backend: {ctx['backend'].kind}. wrk, {w['threads']} threads, {w['step_seconds']} s per step, "
              "keep-alive connections; latencies from wrk --latency (P50 / P90 / P99).", "",
              "The reference validation report's table format:", "",
              "| connections | health P50 / P90 / P99 (ms) | health throughput | JWT P50 / P90 / P99 (ms) "
              "| JWT throughput | server CPU peak | errors |",
              "|---:|---|---:|---|---:|---:|---:|"]

    def trip(s):
        return f"{s['p50_ms']:.2f} / {s['p90_ms']:.2f} / {s['p99_ms']:.2f}" if s else "-"

    def rps(s):
        return f"{s['rps'] / 1000:.1f}k req/s" if s else "-"

    for c in sorted(by):
        h, v = by[c].get("health"), by[c].get("validate")
        peak = max([x["server_cpu_max"] for x in (h, v) if x and x["server_cpu_max"] is not None], default=None)
        errs = sum(step_errors(x) for x in (h, v) if x)
        lines.append(f"| {c} | {trip(h)} | {rps(h)} | {trip(v)} | {rps(v)} | "
                     f"{'-' if peak is None else f'{peak:.0f} %'} | {errs} |")
    lines += ["", "Every step:", "",
              "| endpoint | connections | requests | req/s | avg latency | P50 | P75 | P90 | P99 | max | non-2xx "
              "| server CPU avg / max | server RSS max | wrk CPU avg | machine CPU avg |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in steps:
        lines.append(
            f"| {s['endpoint']} | {s['connections']} | {s['requests']:,} | {s['rps']:,.0f} | {fmt_ms(s['avg_ms'])} | "
            f"{fmt_ms(s['p50_ms'])} | {fmt_ms(s['p75_ms'])} | {fmt_ms(s['p90_ms'])} | {fmt_ms(s['p99_ms'])} | "
            f"{fmt_ms(s['max_ms'])} | {step_errors(s)} | "
            f"{fmt_avg_max((s['server_cpu_avg'], s['server_cpu_max']))} | {fmt_num(s['server_rss_max'])} MiB | "
            f"{fmt_num(s['wrk_cpu_avg'], 0)} % | {fmt_num(s['machine_cpu_avg'], 0)} % |")
    lines += ["", "CPU: 100 % = one core. wrk shares the machine with the server, so its CPU is the load "
              "generator's share of the cores; a closed loop of N connections (wrk) measures throughput at "
              "a concurrency, not latency at a fixed rate.", "",
              f"For comparison, {REFERENCES[scenario]}", ""]
    lines += run_details(ctx, [f"wrk: {w['wrk_version']}; script loadtest/wrk/validate.lua; token of "
                               "user1@loadtest.latchkey (raw/token)"])
    return "\n".join(lines) + "\n", verdict


def run_details(ctx, extra):
    m = ctx["machine"]
    warns, errors, samples = ctx["log_findings"]
    ram = "?" if m["ram_gib"] is None else f"{m['ram_gib']:.1f} GiB"
    lines = ["## Run", "",
             f"- command: `{ctx['command']}`",
             f"- date: {ctx['date_iso']} (UTC)",
             f"- git revision: {ctx['revision']}; binary {ctx['binary']} ({ctx['binary_state']}): "
             f"{ctx['binary_version']}",
             f"- machine: {m['nproc']} CPUs, {m['cpu']}, {ram} RAM, Linux {m['kernel']}",
             f"- backend: {ctx['backend'].description}",
             f"- pinning: {common.pinning_note()}",
             "- server settings: LATCHKEY_RATE_LIMIT=off, LATCHKEY_LOG=warn"
             + ("".join(f", {k}={v}" for k, v in ctx["user_settings"].items())),
             f"- seeding: {ctx['seed_output'] or 'none (this scenario registers its own accounts)'}"]
    lines += [f"- {e}" for e in extra]
    lines.append(f"- server log: {warns} warnings, {errors} errors (besides the rate-limit-off warning)"
                 + (f"; server exit status {ctx['server_exit']}" if ctx["server_exit"] not in (0, None) else ""))
    for s in samples:
        lines.append("    - `" + s.replace("`", "'") + "`")
    if ctx["other_generators"]:
        lines.append(f"- WARNING: other load generators were running: {'; '.join(ctx['other_generators'])}")
    if ctx["tool"] == "wrk":
        lines.append("- files: summary.json (the parsed wrk steps), latency.png, doc-row.md, raw/ (not committed: "
                     "wrk.log, resources.csv, server.log, seed.log, metrics-end.txt)")
    else:
        lines.append("- files: summary.json (k6 --summary-export), k6-dashboard.html, latency.png, doc-row.md "
                     "(reference scenarios), raw/ (not committed: k6.csv.gz with every sample, timeseries.csv, "
                     "resources.csv, k6.log, server.log, metrics-end.txt)")
    lines.append("")
    return lines


def draw_plot(ctx):
    """latency.png, drawn by loadtest/plot.py in a Python that has matplotlib."""
    py = plotting_python()
    if not py:
        return False
    mode = "--wrk" if ctx["tool"] == "wrk" else "--k6"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([py, "-m", "loadtest.plot", mode, str(ctx["outdir"]),
                        "--title", f"{ctx['scenario']} {ctx['date_human']} ({ctx['backend'].kind})"],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        say(f"warning: the plot could not be drawn: {(r.stderr or r.stdout).strip()[-800:]}")
        return False
    return True


# --------------------------------------------------------------------------
# docs/performance.md rows


def ratio_lower(reference, ours):
    if not reference or not ours:
        return "-"
    return f"{reference / ours:.1f}x lower" if ours <= reference else f"{ours / reference:.1f}x higher"


def ratio_higher(ours, reference):
    if not reference or not ours:
        return "-"
    return f"{ours / reference:.1f}x"


def doc_row(ctx, rows=None, summary=None):
    """The run's row for its scenario's table in docs/performance.md, or None
    (a generic k6 script has no table)."""
    sc = ctx["scenario"]
    if sc not in REFERENCES:
        return None
    folder = os.path.relpath(ctx["outdir"], DOCS.parent)
    run = f"[latchkey {ctx['revision']}]({folder}/report.md)"
    if ctx["scale"] != 1:
        run += f" (scale {scale_text(ctx['scale'])})"
    date = ctx["date_iso"][:10]
    backend = "PostgreSQL + Redis" if ctx["backend"].kind == "postgres" else "embedded"
    res = resource_stats([r for r in ctx["sampler"].rows if r["gen_active"]]) if ctx.get("sampler") else None
    cpu_avg = "-" if not res or res["server_cpu"][0] is None else f"{res['server_cpu'][0]:.0f} %"
    cpu_max = "-" if not res or res["server_cpu"][1] is None else f"{res['server_cpu'][1]:.0f} %"
    m = lambda name: summary_metric(summary, name) or {}  # noqa: E731
    if sc == "validate-throughput":
        steps = ctx["wrk"]["steps"]

        def get(ep, c, key):
            for s in steps:
                if s["endpoint"] == ep and s["connections"] == c:
                    return s[key]
            return None

        def k(v):
            return "-" if v is None else f"{v / 1000:.1f}k"

        peak = max([s["server_cpu_max"] for s in steps if s["server_cpu_max"] is not None], default=None)
        p99 = get("validate", 150, "p99_ms")
        # 20,100 req/s: the reference validation report's JWT throughput at 150 connections.
        return (f"| {run} | {date} | {backend} | {k(get('validate', 50, 'rps'))} | {k(get('validate', 150, 'rps'))} "
                f"| {k(get('validate', 300, 'rps'))} | {fmt_ms(p99)} | {k(get('health', 100, 'rps'))} | "
                f"{'-' if peak is None else f'{peak:.0f} %'} | {ratio_higher(get('validate', 150, 'rps'), 20100)} |")
    a = rows[0] if rows else {}
    if sc == "login-slo":
        # 120.5 ms: the reference login report's P95.
        return (f"| {run} | {date} | {backend} | {fmt_num(a.get('rps'))} | {fmt_pct(a.get('success'))} | "
                f"{fmt_ms(a.get('p50'))} | {fmt_ms(a.get('p95'))} | {fmt_ms(a.get('p99'))} | {fmt_ms(a.get('max'))} | "
                f"{m('dropped_iterations').get('count', 0)} | {cpu_avg} | {ratio_lower(120.5, a.get('p95'))} |")
    if sc == "nearyou-flow":
        checks = m("checks").get("value")
        # 1.33 s: the reference flow report's P95.
        return (f"| {run} | {date} | {backend} | {a.get('count', 0):,} | {fmt_num(a.get('rps'))} | "
                f"{fmt_pct(None if checks is None else checks * 100)} | {fmt_ms(a.get('p50'))} | "
                f"{fmt_ms(a.get('p90'))} | {fmt_ms(a.get('p95'))} | {fmt_ms(a.get('max'))} | {cpu_avg} | "
                f"{ratio_lower(1330, a.get('p95'))} |")
    validate = next((r for r in rows or [] if r["label"].startswith("validate")), {})
    thresholds = thresholds_from_summary(summary)
    failed = [t for t in thresholds if not t[2]]
    return (f"| {run} | {date} | {backend} | {a.get('count', 0):,} | {fmt_num(a.get('rps'))} | "
            f"{fmt_pct(a.get('success'))} | {int(m('unexpected_errors').get('count', 0)):,} | "
            f"{int(m('shed_503').get('count', 0)):,} | {fmt_ms(validate.get('p99'))} | {fmt_ms(a.get('max'))} | "
            f"{cpu_max} | {'FAIL' if failed or ctx['k6']['rc'] != 0 else 'PASS'} |")


def add_doc_row(report, outdir, scenario, row):
    """The report with the run's row for docs/performance.md at its end, and
    the text of doc-row.md, written to the result folder: the row and where
    it goes (None, None when there is no row). Nothing rewrites
    docs/performance.md: a person reads the report and pastes the row."""
    if not row:
        return report, None
    marker = f"<!-- loadtest:history:{scenario} -->"
    text = (f"Row for the `{scenario}` table of docs/performance.md (paste it on the line above "
            f"`{marker}`):\n\n{row}\n")
    (outdir / "doc-row.md").write_text(text)
    return report + f"Row for docs/performance.md:\n\n{row}\n", text


# --------------------------------------------------------------------------
# The gateway and limiter benchmarks


def bench_machine_line():
    """git revision, cores, CPU, RAM and kernel, as the benchmarks' reports open."""
    m = machine_info()
    ram = "?" if m["ram_gib"] is None else f"{m['ram_gib']:.0f}"
    return (f"git {git_revision(describe=False)} (+ working tree), {m['nproc']} cores ({m['cpu']}), {ram} GiB, "
            f"Linux {m['kernel']}")


OPEN_MODEL_GENERATORS = {
    "vegeta": "vegeta attack (constant rate; 0.3-0.6 core at 5,000/s)",
    "k6": "k6 constant-arrival-rate (the tool of the reference reports; 0.6-0.9 core at 5,000/s, GOGC=off)",
}


def gateway_report(results, args, started, command):
    lines = [
        f"Run {started.strftime('%Y-%m-%d %H:%M')} UTC, {bench_machine_line()}; "
        "everything (load generator, upstream, gateway or HAProxy, Redis, latchkey) on the same machine. "
        + (f"Pinned: the targets and the upstream on CPU {common.PINNING[0]}, the generator on CPU "
           f"{common.PINNING[1]} (taskset); Redis and the service that issued the tokens are not pinned."
           if common.PINNING else "Not pinned."),
        f"Command: `{command}`",
        "",
    ]
    conns = [int(c) for c in args.conns.split(",")]
    if not args.no_wrk:
        lines += [
            f"Maximum throughput (wrk -t{common.wrk_threads()}, keep-alive, 100 ES256 tokens in rotation, "
            f"{args.wrk_secs} s per cell):",
            "",
            "| target | " + " | ".join(f"c{c} req/s | c{c} P50 / P99 ms" for c in conns)
            + " | CPU us/req (c%d) | wrk CPU (cores) | steal |" % conns[-1],
            "|---|" + "---|---|" * len(conns) + "---|---|---|",
        ]
        for t, r in results.items():
            cells = []
            for c in conns:
                w = r["wrk"].get(c)
                if w is None:
                    cells += ["", ""]
                    continue
                err = w["errors"]["status"] + w["errors"]["timeout"]
                cells += [f"{w['rps']:,.0f}" + (f" ({err} errors)" if err else "")
                          + (" (disturbed)" if w.get("disturbed") else ""),
                          f"{w['latency_us']['p50'] / 1000:.2f} / {w['latency_us']['p99'] / 1000:.2f}"]
            last = r["wrk"].get(conns[-1], {})
            cpu_req = f"{last.get('cpu_us_per_req', 0):.1f}"
            if t == "gateway-redis" and last:
                cpu_req += f" (+ Redis {last['redis_cpu_us_per_req']:.1f})"
            steal = max((w.get("steal", 0) for w in r["wrk"].values()), default=0)
            lines.append(f"| {t} | " + " | ".join(cells)
                         + f" | {cpu_req} | {last.get('generator_cores', 0):.2f} | {steal:.0%} |")
        lines.append("")
    for gen in args.generators.split(","):
        if not any(r["open"].get(gen) for r in results.values()):
            continue
        base = results.get("upstream", {}).get("open", {}).get(gen) or []
        lines += [
            f"Open model, {OPEN_MODEL_GENERATORS[gen]}, {args.rate}/s, {args.k6_secs} s per run, "
            f"{args.k6_rounds} rounds with the targets interleaved; medians over the rounds "
            "(P99 of each round in brackets):",
            "",
            "| target | achieved req/s | P50 ms | P90 ms | P99 ms | max ms | failed | dropped | "
            f"P99 added vs direct | target CPU (cores) | {gen} CPU (cores) | steal |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for t, r in results.items():
            ks = r["open"].get(gen) or []
            if not ks:
                continue
            m = {key: median([k[key] for k in ks]) for key in
                 ("rps", "p50", "p90", "p99", "max", "failed", "cpu_share", "generator_cores", "steal")}
            dropped = sum(k["dropped"] for k in ks)
            added = ""
            if base and t != "upstream":
                diffs = [k["p99"] - b["p99"] for k, b in zip(ks, base)]
                added = f"{median(diffs):+.2f} ms [" + ", ".join(f"{d:+.2f}" for d in diffs) + "]"
            per_round = ", ".join(f"{k['p99']:.2f}" + ("*" if k.get("disturbed") else "") for k in ks)
            lines.append(
                f"| {t} | {m['rps']:,.0f} | {m['p50']:.2f} | {m['p90']:.2f} | {m['p99']:.2f} [{per_round}] | "
                f"{m['max']:.1f} | {m['failed'] * 100:.2f} % | {dropped} | {added} | "
                f"{m['cpu_share']:.2f} | {m['generator_cores']:.2f} | {m['steal']:.0%} |"
            )
        lines.append("")
    lines.append("(* a round during which another load generator or build appeared, after 3 tries. "
                 "steal: share of the machine's CPU time the hypervisor gave to other guests during the runs. "
                 "P99 added: per round, the target's P99 minus the direct upstream's P99 of the same round and "
                 "generator; the median, then each round in brackets.)")
    lines.append("")
    return "\n".join(lines) + "\n"


def limiter_report(results, args, clients, started, command):
    lines = [
        f"# Rate-limit cost: {started.strftime('%Y-%m-%d %H:%M')} UTC",
        "",
        f"{bench_machine_line()}; wrk, the servers and Redis on the same machine. {common.pinning_note()}",
        f"Command: `{command}`; wrk -t{common.wrk_threads()} -c{args.conns}, {args.secs} s per cell, "
        f"{args.rounds} rounds interleaved; medians (each round's req/s in brackets).",
        "",
        "| clients | unlimited req/s | Redis-limited req/s | lost | Redis calls per request | checks that waited "
        "for Redis, per request | in-process-limited req/s | lost | P99 ms (unlimited / Redis / in-process) "
        "| CPU us per request: latchkey unlimited / Redis-limited; Redis |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    def lost(xs, unlimited):
        return median([1 - x["rps"] / b["rps"] for x, b in zip(xs, unlimited)])

    def rates(xs):
        return f"{median([x['rps'] for x in xs]):,.0f} [" + ", ".join(f"{x['rps'] / 1000:.1f}k" for x in xs) + "]"

    for n in clients:
        u, r, loc = (results[(name, n)] for name in ("unlimited", "redis", "local"))
        bad = sum(x["errors"]["status"] for x in u + r + loc)
        p99 = " / ".join(f"{median([x['latency_us']['p99'] for x in xs]) / 1000:.2f}" for xs in (u, r, loc))
        waited = median([x.get("waited_per_req", 0.0) for x in r])
        cpu = (f"{median([x['cpu_us'] for x in u]):.1f} / {median([x['cpu_us'] for x in r]):.1f}; "
               f"{median([x['redis_us'] for x in r]):.1f}")
        lines.append(f"| {n:,} | {rates(u)} | {rates(r)} | {lost(r, u):.1%} | "
                     f"{median([x['redis_calls_per_req'] for x in r]):.3f} | {waited:.3f} | {rates(loc)} | "
                     f"{lost(loc, u):.1%} | {p99} | {cpu} |"
                     + (f" ({bad} non-2xx!)" if bad else ""))
    if getattr(args, "compare", None):
        lines += [
            "",
            f"The other build (`--compare`: `{args.compare}`), Redis-limited, in the same rounds:",
            "",
            "| clients | Redis-limited req/s | lost | Redis calls per request | checks that waited for Redis, "
            "per request | P99 ms | CPU us per request: latchkey; Redis |",
            "|---:|---:|---:|---:|---:|---:|---|",
        ]
        for n in clients:
            u, o = results[("unlimited", n)], results[("redis-other", n)]
            bad = sum(x["errors"]["status"] for x in o)
            lines.append(f"| {n:,} | {rates(o)} | {lost(o, u):.1%} | {median([x['redis_calls_per_req'] for x in o]):.3f} | "
                         f"{median([x.get('waited_per_req', 0.0) for x in o]):.3f} | "
                         f"{median([x['latency_us']['p99'] for x in o]) / 1000:.2f} | "
                         f"{median([x['cpu_us'] for x in o]):.1f}; {median([x['redis_us'] for x in o]):.1f} |"
                         + (f" ({bad} non-2xx!)" if bad else ""))
    lines.append("")
    return "\n".join(lines) + "\n"

