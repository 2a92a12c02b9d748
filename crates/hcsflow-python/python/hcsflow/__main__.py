"""``python -m hcsflow``: the engine's commands from the Python package.

``run`` and ``functions`` behave as the ``hcsflow`` binary's commands of the
same names, with the same exit codes: 0 done, 1 a well (or the run) failed,
2 a usage error found before any pixel was read, 3 the device is unavailable.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import (CompileError, DeviceUnavailableError, HcsflowError, _hcsflow, function_names, run)
from .functions import _CATALOGUE


def _run(a: argparse.Namespace) -> int:
    def progress(event: dict) -> None:
        if event["event"] == "finished":
            state = f"failed: {event['error']}" if event["error"] else "complete"
            print(f"[{event['done']}/{event['total']}] well {event['well']} {state} ({event['seconds']:.2f} s)",
                  file=sys.stderr)

    result = run(a.plate, a.pipeline, a.out, device=a.device, workers=a.workers, resume=a.resume,
                 overwrite=a.overwrite, dry_run=a.dry_run, allow_software_gpu=a.allow_software_gpu,
                 allow_host_round_trip=a.allow_host_round_trip, progress=progress)
    if a.dry_run:
        print(result, end="")
        return 0
    done = len(result["completed"]) + len(result["skipped"])
    print(f"{done} of {result['total']} well(s) complete, {len(result['failed'])} failed, "
          f"{len(result['not_started'])} not started; outputs: {result['out']}", file=sys.stderr)
    for f in result["failed"]:
        print(f"error: well {f['well']}: {f['error']}", file=sys.stderr)
    return 1 if result["failed"] or result["not_started"] else 0


def _functions(a: argparse.Namespace) -> int:
    if a.json:
        print(_hcsflow.catalogue_json())
        return 0
    for name in function_names():
        spec = _CATALOGUE[name]
        print(f"{name}  [{spec['contract']}; {', '.join(spec['memory_types'])}]")
        print(f"    {spec['doc']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hcsflow", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run", help="compile a pipeline for a plate and run it (or print the plan)")
    r.add_argument("plate")
    r.add_argument("pipeline")
    r.add_argument("out")
    r.add_argument("--dry-run", action="store_true", help="print the compiled plan and stop")
    r.add_argument("--device", default="auto", help="auto | cpu | gpu | gpu:N")
    r.add_argument("--workers", type=int, default=None)
    r.add_argument("--resume", action="store_true")
    r.add_argument("--overwrite", action="store_true")
    r.add_argument("--allow-software-gpu", action="store_true")
    r.add_argument("--allow-host-round-trip", action="store_true")
    r.set_defaults(handler=_run)
    f = commands.add_parser("functions", help="list every function")
    f.add_argument("--json", action="store_true")
    f.set_defaults(handler=_functions)
    a = parser.parse_args(argv)
    try:
        return a.handler(a)
    except CompileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except DeviceUnavailableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except HcsflowError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
