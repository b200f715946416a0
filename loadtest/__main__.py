"""python3 -m loadtest [SCENARIO | gateway | limiter | overhead | refresh-capacity | oidc-compare | rig | faults | scaling] [options]: what
scripts/loadtest runs (see `scripts/loadtest --help`)."""

import importlib
import signal
import sys

from .common import RunError, say
from .runners import stop_children


# Families with a module and flags of their own (each starts its servers
# and generators); anything else is a service scenario.
FAMILIES = {
    "gateway": "gateway_bench",
    "limiter": "limiter_bench",
    "overhead": "overhead",
    "refresh-capacity": "refresh_capacity",
    "rig": "rig",
    "faults": "faults",
    "scaling": "scaling",
    "oidc-compare": "oidc_compare",
}


def main(argv):
    module = FAMILIES.get(argv[0]) if argv else None
    if module:
        return importlib.import_module(f".{module}", __package__).main(argv[1:])
    from . import service

    return service.main(argv)


def on_sigterm(_signum, _frame):
    # Unwind through the finally blocks: the servers and the throwaway
    # database must not outlive the run.
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        sys.exit(main(sys.argv[1:]))
    except RunError as e:
        stop_children()
        say(f"error: {e}")
        sys.exit(3)
    except KeyboardInterrupt:
        stop_children()
        say("interrupted")
        sys.exit(130)
