"""CPU profiles of a server under load, for the benchmarks' `--perf`:
`perf record --call-graph dwarf` of one process while a load runs, drawn as
a flame graph (inferno) and summed per function, so that two variants'
costs per request can be set side by side."""

import shutil
import subprocess

from .common import RunError, say

PERF_HZ = 999


def require_tools():
    for tool, install in (("perf", "apt-get install linux-perf"), ("inferno-collapse-perf", "cargo install inferno"),
                          ("inferno-flamegraph", "cargo install inferno")):
        if not shutil.which(tool):
            raise RunError(f"--perf needs {tool} ({install})")


def record(pid, secs, load, raw, outdir, name, title):
    """Profiles process `pid` for `secs` seconds while `load()` runs (it
    returns the requests it made); writes flame-<name>.svg to `outdir` and
    the folded stacks to `raw`, and returns (requests, {function: own CPU
    in ns}), a function's own CPU being the samples where it is the leaf of
    the stack."""
    data = raw / f"perf-{name}.data"
    perf = subprocess.Popen(["perf", "record", "-F", str(PERF_HZ), "--call-graph", "dwarf,16384", "-p", str(pid),
                             "-o", str(data), "--", "sleep", str(secs)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    requests = load()
    perf.wait()
    script = subprocess.run(["perf", "script", "-i", str(data)], capture_output=True, check=True).stdout
    folded = subprocess.run(["inferno-collapse-perf"], input=script, capture_output=True, check=True).stdout
    # Frames under a pixel wide are left out: a tenth of the size, the same picture.
    svg = subprocess.run(["inferno-flamegraph", "--minwidth", "1", "--title", title], input=folded,
                         capture_output=True, check=True).stdout
    (outdir / f"flame-{name}.svg").write_bytes(svg)
    (raw / f"folded-{name}.txt").write_bytes(folded)
    own = {}
    for line in folded.decode(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        leaf = stack.rsplit(";", 1)[-1]
        own[leaf] = own.get(leaf, 0) + int(count)
    data.unlink()  # hundreds of MiB with dwarf call graphs; the SVG keeps the stacks
    say(f"profiled {name}: {requests:,} requests, {sum(own.values()) / 1e9:.2f} s of CPU sampled")
    return requests, own


def table(profiles, command, comparisons, top=30):
    """profile.md: CPU per request by function, the profiled variants side by
    side, one table per (variant, base) in `comparisons`, ordered by what the
    variant pays over the base. perf weighs each sample by its period, which
    for the cpu-clock event is in nanoseconds."""
    per = {n: {f: c / max(1, req) for f, c in own.items()} for n, (req, own) in profiles.items()}
    names = list(per)
    funcs = set().union(*per.values())
    lines = ["# Profiles", "", f"Command: `{command.strip()}` (`--perf`: one extra run per profiled variant "
             f"under `perf record -F {PERF_HZ} --call-graph dwarf`)", "",
             "Each function's own CPU time in nanoseconds per request (the samples where it is the leaf of "
             "the stack, weighed by their period; the event is cpu-clock, so the period is in ns). Profiling "
             "slows the server, so the totals run above the rounds' figures. The flame graphs "
             "(flame-<variant>.svg) show the callers."]
    for cell, base in comparisons:
        if cell not in per or base not in per:
            continue
        order = sorted(funcs, key=lambda f: per[cell].get(f, 0) - per[base].get(f, 0), reverse=True)[:top]
        lines += ["", f"## What `{cell}` pays over `{base}` ({top} functions)", "",
                  "| function | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names),
                  "| **all** | " + " | ".join(f"{sum(per[n].values()):,.0f}" for n in names) + " |"]
        for f in order:
            label = f if len(f) <= 110 else f[:107] + "..."
            lines.append(f"| `{label.replace('|', '/')}` | "
                         + " | ".join(f"{per[n].get(f, 0):.0f}" for n in names) + " |")
    return "\n".join(lines) + "\n"
