"""Draws latency.png for a result folder written by scripts/loadtest (the
report module runs it in a Python that has matplotlib, with the repository
root on PYTHONPATH; it imports nothing else of the package).

  python3 -m loadtest.plot --k6 DIR   from DIR/raw/timeseries.csv and
        DIR/raw/resources.csv: P50 / P95 / P99 per second, throughput and
        errors per second, server / k6 / machine CPU and server RSS
  python3 -m loadtest.plot --wrk DIR  from DIR/summary.json: req/s and
        P50 / P99 by the number of connections, for /auth/validate and
        /health/live
"""

import argparse
import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def plot_k6(d, title):
    ts = read_csv(d / "raw" / "timeseries.csv")
    if not ts:
        raise SystemExit("no samples in raw/timeseries.csv")
    t0 = int(ts[0]["second"])
    x = [int(r["second"]) - t0 for r in ts]
    res_path = d / "raw" / "resources.csv"
    res = read_csv(res_path) if res_path.exists() else []

    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(11, 9), sharex=True,
                                        gridspec_kw={"height_ratios": [3, 2, 2]})
    for key, label, style in (("p50_ms", "P50", "-"), ("p95_ms", "P95", "-"), ("p99_ms", "P99", "--")):
        ax1.plot(x, [num(r[key]) for r in ts], style, label=f"{label} (all requests)", linewidth=1.2)
    focus = [k for k in ts[0] if k.endswith("_p99_ms") and k not in ("p99_ms", "focus_p99_ms")]
    for key in focus:
        ax1.plot(x, [num(r[key]) for r in ts], ":", label=f"P99 /{key[:-len('_p99_ms')]}", linewidth=1.5,
                 color="black")
    ax1.set_ylabel("latency per second (ms)")
    ax1.set_yscale("log")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(loc="upper left")
    ax1.set_title(title)

    ax2.plot(x, [int(r["requests"]) for r in ts], label="requests/s", color="tab:blue", linewidth=1.2)
    errs = [int(r["errors"]) for r in ts]
    if any(errs):
        ax2.plot(x, errs, label="failed responses/s (incl. 429 / 503)", color="tab:red", linewidth=1.2)
    ax2.set_ylabel("throughput (1/s)")
    ax2.grid(True, alpha=0.3)
    ax2.legend(loc="upper left")
    vus = [num(r.get("vus")) for r in ts]
    if any(v is not None for v in vus):
        ax2b = ax2.twinx()
        ax2b.plot(x, vus, color="tab:purple", linestyle="--", linewidth=1.0, label="VUs")
        ax2b.set_ylabel("VUs")
        ax2b.legend(loc="upper right")

    if res:
        rx = [int(r["time_ms"]) / 1000 - t0 for r in res]
        for key, label in (("server_cpu_pct", "latchkey CPU %"), ("gen_cpu_pct", "load generator CPU %"),
                           ("machine_cpu_pct", "machine CPU %")):
            ax3.plot(rx, [num(r[key]) for r in res], label=label, linewidth=1.0)
        ax3.set_ylabel("CPU (100 % = 1 core)")
        ax3.grid(True, alpha=0.3)
        ax3.legend(loc="upper left")
        ax3b = ax3.twinx()
        ax3b.plot(rx, [num(r["server_rss_mib"]) for r in res], color="tab:gray", linestyle=":",
                  label="latchkey RSS (MiB)")
        ax3b.set_ylabel("RSS (MiB)")
        ax3b.legend(loc="upper right")
    ax3.set_xlabel("seconds since the first request")
    fig.tight_layout()
    fig.savefig(d / "latency.png", dpi=110)


def plot_wrk(d, title):
    summary = json.loads((d / "summary.json").read_text())
    steps = summary["steps"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for endpoint, color in (("validate", "tab:blue"), ("health", "tab:green")):
        ss = sorted((s for s in steps if s["endpoint"] == endpoint), key=lambda s: s["connections"])
        if not ss:
            continue
        c = [s["connections"] for s in ss]
        ax1.plot(c, [s["rps"] for s in ss], "o-", color=color, label=f"/{endpoint} req/s")
        ax2.plot(c, [s["p50_ms"] for s in ss], "o-", color=color, label=f"/{endpoint} P50")
        ax2.plot(c, [s["p99_ms"] for s in ss], "s--", color=color, label=f"/{endpoint} P99")
    ax1.set_ylabel("throughput (req/s)")
    ax1.set_title(title)
    ax1.grid(True, alpha=0.3)
    ax1.legend()
    ax2.set_ylabel("latency (ms)")
    ax2.set_xlabel("connections (wrk, keep-alive)")
    ax2.grid(True, alpha=0.3)
    ax2.legend()
    fig.tight_layout()
    fig.savefig(d / "latency.png", dpi=110)


def main():
    p = argparse.ArgumentParser()
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--k6", metavar="DIR")
    g.add_argument("--wrk", metavar="DIR")
    p.add_argument("--title", default="")
    a = p.parse_args()
    if a.k6:
        plot_k6(Path(a.k6), a.title)
    else:
        plot_wrk(Path(a.wrk), a.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
