"""Runs a training job's workers as processes on one machine, in sync and
diloco mode, and compares them side by side.

    python -m deepmarket.bench_local --workers 1,2 --modes sync,diloco \\
        -- --model cnn-wide --target-accuracy 0.90 --eval-every 200

Each worker gets the environment a DeepMarket node gives it (TF_CONFIG,
DM_RANK, DM_WORLD_SIZE, DM_WORKERS, DM_AVG_PEERS, DM_CORES, DM_DATA_DIR,
DM_OUTPUT_DIR, DM_JOB_ID, MASTER_ADDR/MASTER_PORT) with ports on 127.0.0.1
(or --hosts), and is pinned to a core of its own when there are enough.
The table gives, per mode and worker count: time to the target accuracy,
final accuracy, examples/s, bytes sent per worker (and per round), and the
ratios to one worker and to sync mode.

--print-plan prints the workers' command lines and environments as JSON
without running anything: a benchmark that shapes the links between
workers (netem between namespaces, say) starts the same commands itself.
plan() gives the same from Python.

Needs only the standard library (and train.py's own environment to run it).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_TRAIN_PY = os.path.join(REPO, "examples", "fashion-mnist", "train.py")
DEFAULT_ARGS = ["--model", "cnn-wide", "--target-accuracy", "0.90", "--eval-every", "200",
                "--epochs", "10", "--sync-every", "100"]


@dataclass
class WorkerSpec:
    """WorkerSpec is how to start one worker: what a node would run."""
    rank: int
    argv: list
    env: dict          # added to the inherited environment
    cwd: str
    out: str           # its DM_OUTPUT_DIR
    cpu: int = None    # the core to pin it to, if any
    log: str = ""


@dataclass
class Outcome:
    mode: str
    workers: int
    wall_s: float
    rcs: list
    result: dict = field(default_factory=dict)
    worker_stats: list = field(default_factory=list)


def free_ports(n, host="127.0.0.1"):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((host, 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def plan(mode, workers, train_args, out_dir, python=sys.executable, train_py=DEFAULT_TRAIN_PY,
         hosts=None, tf_ports=None, avg_ports=None, data=None, pin=True, job_id=None):
    """Returns the WorkerSpecs of one run: `workers` processes of train.py in `mode`.

    hosts: one address per rank (default 127.0.0.1 for all); tf_ports and
    avg_ports: one port per rank (default: free ports of this machine).
    """
    hosts = hosts or ["127.0.0.1"] * workers
    if len(hosts) != workers:
        raise ValueError("%d hosts for %d workers" % (len(hosts), workers))
    tf_ports = tf_ports or free_ports(workers)
    avg_ports = avg_ports or free_ports(workers)
    tf_addrs = ["%s:%d" % (h, p) for h, p in zip(hosts, tf_ports)]
    avg_addrs = ["%s:%d" % (h, p) for h, p in zip(hosts, avg_ports)]
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pin = pin and len(cores) >= workers
    job_id = job_id or "bench-%s-%d-%d" % (mode, workers, os.getpid())
    specs = []
    for r in range(workers):
        out = os.path.join(out_dir, "%s-%dw" % (mode, workers), "w%d" % r)
        env = {
            "TF_CONFIG": json.dumps({"cluster": {"worker": tf_addrs}, "task": {"type": "worker", "index": r}}),
            "DM_JOB_ID": job_id, "DM_RANK": str(r), "DM_WORLD_SIZE": str(workers),
            "DM_WORKERS": ",".join(tf_addrs), "DM_AVG_PEERS": ",".join(avg_addrs),
            "DM_CORES": "1", "DM_OUTPUT_DIR": out,
            "MASTER_ADDR": hosts[0], "MASTER_PORT": str(tf_ports[0]),
            "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
        }
        if data:
            env["DM_DATA_DIR"] = data
        argv = [python, train_py, "--mode", mode] + list(train_args)
        specs.append(WorkerSpec(rank=r, argv=argv, env=env, cwd=os.path.dirname(os.path.abspath(train_py)),
                                out=out, cpu=cores[r] if pin else None, log=os.path.join(out, "..", "w%d.log" % r)))
    return specs


def run(specs, mode, timeout):
    """Starts the workers, waits for all of them; returns an Outcome."""
    procs = []
    t0 = time.time()
    for s in specs:
        os.makedirs(s.out, exist_ok=True)
        logf = open(s.log, "w")
        cpu = s.cpu
        procs.append((subprocess.Popen(
            s.argv, cwd=s.cwd, env=dict(os.environ, **s.env), stdout=logf, stderr=subprocess.STDOUT,
            preexec_fn=(lambda c=cpu: os.sched_setaffinity(0, {c})) if cpu is not None else None), logf))
    rcs = []
    for p, logf in procs:
        try:
            rcs.append(p.wait(timeout=max(1, timeout - (time.time() - t0))))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(p.wait())
        logf.close()
    out = Outcome(mode=mode, workers=len(specs), wall_s=round(time.time() - t0, 1), rcs=rcs)
    try:
        with open(os.path.join(specs[0].out, "result.json")) as f:
            out.result = json.load(f)
    except (OSError, ValueError):
        pass
    for s in specs:
        try:
            with open(os.path.join(s.out, "worker-%d.json" % s.rank)) as f:
                out.worker_stats.append(json.load(f))
        except (OSError, ValueError):
            pass
    return out


def per_worker_bytes(o):
    """(bytes sent per worker, bytes a round per worker), means over workers."""
    if o.worker_stats:
        sent = [w["bytes_sent"] for w in o.worker_stats]
        per_round = [w["bytes_sent_per_round"] for w in o.worker_stats]
        return sum(sent) / len(sent), sum(per_round) / len(per_round)
    b = o.result.get("bytes_sent")
    rounds = o.result.get("rounds") or 0
    return b, (b / rounds if b and rounds else 0)


def table(outcomes):
    """The comparison as text lines."""
    head = ("mode", "workers", "time to target s", "final acc", "examples/s", "MB sent/worker",
            "KB/round/worker", "rounds", "wall s", "ok")
    rows = []
    for o in outcomes:
        r = o.result
        b, br = per_worker_bytes(o)
        ttt = r.get("time_to_target_s")
        rows.append((o.mode, str(o.workers), "%.1f" % ttt if ttt is not None else "not reached",
                     "%.4f" % r["test_accuracy"] if "test_accuracy" in r else "-",
                     "%.0f" % r["examples_per_s"] if "examples_per_s" in r else "-",
                     "%.2f" % (b / 1e6) if b is not None else "-", "%.1f" % (br / 1e3) if br else "-",
                     str(r.get("rounds", "-")), "%.1f" % o.wall_s,
                     "yes" if all(rc == 0 for rc in o.rcs) and r else "rc %s" % o.rcs))
    widths = [max(len(x[i]) for x in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in [head] + rows]
    # Ratios: side by side in the same run, as absolute times drift on a shared machine.
    by = {(o.mode, o.workers): o.result for o in outcomes}
    notes = []
    for (mode, n), r in sorted(by.items()):
        one = by.get((mode, 1), {})
        if n > 1 and r.get("time_to_target_s") and one.get("time_to_target_s"):
            notes.append("%s, %d workers vs 1: %.2fx sooner to the target" %
                         (mode, n, one["time_to_target_s"] / r["time_to_target_s"]))
        s = by.get(("sync", n), {})
        if mode == "diloco" and "test_accuracy" in r and "test_accuracy" in s:
            note = "diloco vs sync, %d workers: final accuracy %+.2f points" % (
                n, 100 * (r["test_accuracy"] - s["test_accuracy"]))
            if s.get("bytes_sent"):
                note += ", bytes sent per worker %.3fx" % ((r.get("bytes_sent") or 0) / s["bytes_sent"])
            notes.append(note)
    return lines + [""] + notes


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    train_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, train_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m deepmarket.bench_local",
                                description=__doc__.split("\n\n")[0],
                                epilog="train.py arguments go after --; default: %s" % " ".join(DEFAULT_ARGS))
    p.add_argument("--workers", default="1,2", help="worker counts to run, comma-separated")
    p.add_argument("--modes", default="sync,diloco", help="modes to run, comma-separated")
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs train.py")
    p.add_argument("--train-py", default=DEFAULT_TRAIN_PY)
    p.add_argument("--data", default=None, help="DM_DATA_DIR for the workers (default: train.py's)")
    p.add_argument("--out", default=os.path.join("/tmp", "dm-bench-local-%d" % os.getpid()),
                   help="a folder per run under this")
    p.add_argument("--hosts", default=None, help="one address per rank (default 127.0.0.1)")
    p.add_argument("--ports", default=None, metavar="TF_BASE,AVG_BASE",
                   help="rank j's TensorFlow port is TF_BASE+j and its averaging port AVG_BASE+j, as a node's "
                        "(20000,21000); default: free ports")
    p.add_argument("--no-pin", action="store_true", help="do not pin workers to cores")
    p.add_argument("--timeout", type=float, default=3600, help="seconds a run may take")
    p.add_argument("--print-plan", action="store_true", help="print the workers' commands and env as JSON, run nothing")
    p.add_argument("--json", default=None, help="also write the outcomes to this file")
    a = p.parse_args(argv)
    train_args = train_args or DEFAULT_ARGS
    counts = [int(x) for x in a.workers.split(",") if x]
    bases = [int(x) for x in a.ports.split(",")] if a.ports else None
    if bases is not None and len(bases) != 2:
        p.error("--ports wants TF_BASE,AVG_BASE")

    def specs_for(m, n):
        return plan(m, n, train_args, a.out, a.python, a.train_py, hosts=a.hosts.split(",") if a.hosts else None,
                    tf_ports=[bases[0] + j for j in range(n)] if bases else None,
                    avg_ports=[bases[1] + j for j in range(n)] if bases else None,
                    data=a.data, pin=not a.no_pin)

    modes = [m for m in a.modes.split(",") if m]
    runs = [(m, n) for n in counts for m in modes]
    if a.print_plan:
        print(json.dumps([{"mode": m, "workers": n, "specs": [asdict(s) for s in specs_for(m, n)]}
                          for m, n in runs], indent=2))
        return 0
    outcomes = []
    for m, n in runs:
        specs = specs_for(m, n)
        print("running %s with %d worker(s)%s: %s" % (m, n, " pinned to cores %s" % [s.cpu for s in specs]
              if specs[0].cpu is not None else "", " ".join(train_args)), flush=True)
        o = run(specs, m, a.timeout)
        outcomes.append(o)
        print("  done in %.1fs, exit codes %s, logs in %s" % (o.wall_s, o.rcs, os.path.dirname(specs[0].out)),
              flush=True)
    print()
    print("\n".join(table(outcomes)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([asdict(o) for o in outcomes], f, indent=2)
    return 0 if all(all(rc == 0 for rc in o.rcs) for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
