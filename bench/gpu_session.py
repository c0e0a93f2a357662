#!/usr/bin/env python
"""Issue 55's GPU measurements as two prepared device calls: what a session lent a GPU runs, in order.

A GPU is lent rarely (15 minutes of device time, a bare machine each call, nothing downloadable
there; bench/README.md). Everything here was built and tested on the CPU; this script only runs
the prepared benchmarks one after another, each in its own process under its own time limit, and
puts every record and log into ``--out`` (``$OUT`` on the device: at most 8 files come back). Each
benchmark writes its record as it goes, so a step stopped at its limit still leaves what it measured.

    call 1 (kit ``peer``, 475 s): the open question of the compiled batched step (``batched_compile.py
           --variants batched:0:bf16 batched:1:bf16``, 75 s), then ddlib against ddranking 0.2.0 at the
           peer's defaults and matched (``vs_ddranking.py --device cuda --peer-defaults``, 400 s)
    call 2 (kit ``engine``, 460 s): the batched engine and its levers (``engine_levers.py``, 300 s),
           then the fixed cost per cell (``fixed_cost.py``, 160 s)

Here, before the first call (no device time; both kits at once, so the second call can follow the
first while the machine is still warm)::

    .venv/bin/python bench/device_kit.py               # .whl/{common,peer,engine} and .devdata
    .venv/bin/python bench/gpu_session.py --command 1  # the command, carry and timeout_s for `run`
    .venv/bin/python bench/gpu_session.py --command 2

Afterwards copy the returned ``vs_ddranking_cuda.json``, ``engine_cuda.json`` and ``fixed_cost_cuda.json``
into ``bench/records/`` and their numbers into bench/README.md (device, driver, torch and commit are
in each record's ``machine``).
``--device cpu --dry-run`` lists the steps and checks that every script and option exists (the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from device_kit import INSTALL, carry  # noqa: E402  (bench/device_kit.py, beside this script)

KIT_OF_CALL = {1: "peer", 2: "engine"}  # bench/device_kit.py's kits: the wheels (and data) each call carries
RECORDS = ROOT / "bench" / "records"
CALL_SECONDS = 480  # what one call's steps may take, by the project's rule (the tool allows 600; the install comes first)


def steps(call: int, device: str, out: Path) -> list[dict]:
    """The benchmarks of ``call``: name, argv (run from the checkout), seconds allowed, and the records it
    leaves in ``bench/records/`` (copied into ``out`` when it ends, finished or not)."""
    py, kind = sys.executable, device.split(":")[0]
    if call == 1:
        return [
            # the open question first: the compiled batched step 130,000-160,000 or 65,700 images/s?
            {"name": "batched_compile", "seconds": 75, "records": [],
             "argv": [py, "bench/batched_compile.py", "--device", device, "--variants", "batched:0:bf16", "batched:1:bf16",
                      "--images", "250000", "--no-agreement", "--out", str(out / "batched_compile_question.json")]},
            # the peer as users run it and matched; the budget stops before a step that cannot end in time
            {"name": "vs_ddranking", "seconds": 400, "records": [f"vs_ddranking_{kind}.json"],
             "argv": [py, "bench/vs_ddranking.py", "--device", device, "--peer-defaults", "--peer-python", py,
                      "--budget-seconds", "380", "--record", "--out", str(out / f"vs_ddranking_{kind}_full.json")]},
        ]
    return [
        # engine_levers' record is its whole JSON: --out names it (--record only moves the default path)
        {"name": "engine", "seconds": 300, "records": [],
         "argv": [py, "bench/engine_levers.py", "--device", device, "--budget-seconds", "270", "--record",
                  "--out", str(out / f"engine_{kind}.json")]},
        {"name": "fixed_cost", "seconds": 160, "records": [f"fixed_cost_{kind}.json"],
         "argv": [py, "bench/fixed_cost.py", "--device", device, "--cells", "4", "--record",
                  "--out", str(out / f"fixed_cost_{kind}_full.json")]},
    ]


def device_command(call: int) -> str:
    """The one line a session passes to the device tool's ``run`` for ``call`` (with the commit measured)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return (f"{INSTALL} export DDLIB_BENCH_COMMIT={commit} PYTHONUNBUFFERED=1; "
            f"python3 bench/gpu_session.py --call {call} --out $OUT")


def run_step(step: dict, out: Path) -> dict:
    log = out / f"{step['name']}.log"
    t = time.perf_counter()
    with open(log, "w") as fh:
        try:
            rc = subprocess.run(step["argv"], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                timeout=step["seconds"]).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    seconds = round(time.perf_counter() - t, 1)
    copied = []
    for name in step["records"]:
        if (RECORDS / name).exists():
            shutil.copyfile(RECORDS / name, out / name)
            copied.append(name)
    tail = log.read_text()[-1500:]
    print(f"{step['name']}: rc {rc}, {seconds} s (limit {step['seconds']} s), records {copied}\n{tail}", flush=True)
    return {"name": step["name"], "rc": rc, "seconds": seconds, "limit": step["seconds"], "records": copied}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--call", type=int, choices=(1, 2), help="which device call to run")
    ap.add_argument("--command", type=int, choices=(1, 2), help="print call N's device command and its carry; run nothing")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "bench" / "results"))
    ap.add_argument("--dry-run", action="store_true", help="list the steps and check each script's options; run nothing")
    args = ap.parse_args(argv)
    if args.command:
        kit = KIT_OF_CALL[args.command]
        print(json.dumps({"command": device_command(args.command), "carry": carry(kit), "kit": kit,
                          "timeout_s": CALL_SECONDS + 80}, indent=1))
        return 0
    if not args.call:
        ap.error("--call 1|2 (or --command 1|2)")
    plan = steps(args.call, args.device, args.out)
    if sum(s["seconds"] for s in plan) > CALL_SECONDS:
        raise SystemExit(f"gpu_session: call {args.call}'s steps allow more than {CALL_SECONDS} s")
    if args.dry_run:
        for step in plan:
            done = subprocess.run([step["argv"][0], step["argv"][1], "--help"], cwd=ROOT, capture_output=True, text=True)
            options = {a for a in step["argv"][2:] if a.startswith("--")}
            missing = sorted(o for o in options if o not in done.stdout)
            print(f"{step['name']} ({step['seconds']} s): {shlex.join(step['argv'][1:])}"
                  + (f"  MISSING OPTIONS {missing}" if missing or done.returncode else ""))
            if missing or done.returncode:
                return 1
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    session = {"call": args.call, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
               "cuda_available": torch.cuda.is_available(), "commit": os.environ.get("DDLIB_BENCH_COMMIT"),
               "steps": []}
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_session: no CUDA device here")
    for step in plan:
        session["steps"].append(run_step(step, args.out))
        (args.out / f"session_call{args.call}.json").write_text(json.dumps(session, indent=1))
    return 0 if all(s["rc"] == 0 for s in session["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
