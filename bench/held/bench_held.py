#!/usr/bin/env python3
"""Held DiLoCo, side by side: what the holder's checks cost and what they save.

Runs the example's train.py as the holder and 3 workers, processes on
loopback, in seven settings: all honest with the checks on and off, one
worker multiplying its updates by 1000 (hostile_worker.py) with the checks
on and off, and spot checks: all honest with them on, and one worker
handing in a third of its update (a shirker: the work of fewer steps than
it says) with them on and off. Every setting runs the same rounds from the
same seeds.

Machines of known size, emulated by CPU affinity on this 2-core machine:
the holder alone on CPU 0 (a 1-core submitter), the 3 workers together on
CPU 1 (a third of a core each). Printed and written to OUT (json and md):

  - the checks' cost: the holder's time in checks per round over the
    round's time, and the round time with the checks on over off;
  - the holder's CPU while it coordinates 3 workers (cores, goal <= 1);
  - the final test accuracy with one poisoning worker of 3, beside all
    honest (goal: within 0.5 points) and with the checks off;
  - the share of the accepted seconds (what the escrow pays) that went to
    the poisoning worker (goal 0);
  - spot checks: the replay's time per check, the round time with them on
    over off, and the shirker's share of the paid seconds with them on
    (0 once it is caught) and off.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
TRAIN = os.path.join(REPO, "examples", "fashion-mnist", "train.py")
HOSTILE = os.path.join(REPO, "python", "tests", "hostile_worker.py")
DATA = "/usr/share/datasets/fashion-mnist"


def free_addrs(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    addrs = ["127.0.0.1:%d" % s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return addrs


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick


def run(args, hostile, checks, verify=0.0, workers=3):
    addrs = free_addrs(workers + 1)
    common = ["--mode", "diloco", "--data", DATA, "--model", args.model, "--epochs", str(args.epochs),
              "--steps-per-epoch", str(args.steps), "--sync-every", str(args.sync_every), "--compress", "int8",
              "--no-overlap", "--join-timeout", "60", "--round-timeout", "60", "--verify-rate", str(verify)]
    with tempfile.TemporaryDirectory() as d:
        procs = []
        for rank in range(workers + 1):
            env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", DM_CORES="1",
                       PYTHONPATH=os.path.join(REPO, "python"), DM_AVG_PEERS=",".join(addrs[:workers]),
                       DM_AVG_HOLDER=addrs[workers], DM_JOB_ID="bench-held")
            env.pop("TF_CONFIG", None)
            argv = [sys.executable, TRAIN] + common + ["--out", os.path.join(d, "out%d" % rank)]
            cpu = {0}
            if rank == workers:
                env["DM_ROLE"] = "holder"
                if not checks:
                    argv.append("--no-checks")
            else:
                cpu = {1}
                env["DM_RANK"] = str(rank)
                if hostile and rank == workers - 1:
                    env["DM_HOSTILE"] = hostile
                    argv = [sys.executable, HOSTILE] + argv[1:]
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                          preexec_fn=lambda c=cpu: os.sched_setaffinity(0, c)))
        holder = procs[-1]
        # The holder's CPU from its first round to its end (start-up left out).
        lines, cpu0, t0, cpu1, t1 = [], None, None, None, None
        for line in holder.stdout:
            lines.append(line.rstrip("\n"))
            if cpu0 is None and "holding the model" in line:
                cpu0, t0 = cpu_seconds(holder.pid), time.monotonic()
            if "test: loss" in line and t0 is not None:
                cpu1, t1 = cpu_seconds(holder.pid), time.monotonic()
        holder.wait()
        for p in procs[:-1]:
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
        path = os.path.join(d, "out%d" % workers, "result.json")
        if holder.returncode != 0 or not os.path.exists(path):
            raise SystemExit("the holder failed (%s):\n%s" % (holder.returncode, "\n".join(lines[-40:])))
        with open(path) as f:
            res = json.load(f)
    res["holder_cores"] = round((cpu1 - cpu0) / (t1 - t0), 3) if t0 and t1 and t1 > t0 else None
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="cnn", help="train.py's --model (default cnn)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=200, help="steps per epoch per worker")
    p.add_argument("--sync-every", type=int, default=50)
    p.add_argument("--verify-rate", type=float, default=0.25, help="the spot checks' rate in their settings")
    p.add_argument("--out", default=os.path.join(REPO, "bench", "results", "held"))
    args = p.parse_args()
    if not os.path.isdir(DATA):
        raise SystemExit("no Fashion-MNIST in %s: apt-get install dataset-fashion-mnist" % DATA)
    rows = {}
    spot = "spot checks %g" % args.verify_rate
    for name, hostile, checks, verify in [
            ("honest, checks on", None, True, 0), ("honest, checks off", None, False, 0),
            ("1 poisoning of 3, checks on", "scaled", True, 0), ("1 poisoning of 3, checks off", "scaled", False, 0),
            ("honest, " + spot, None, True, args.verify_rate),
            ("1 shirker of 3, " + spot, "shirk", True, args.verify_rate),
            ("1 shirker of 3, spot checks off", "shirk", True, 0)]:
        t = time.monotonic()
        r = run(args, hostile, checks, verify)
        acc = r["accounts"]
        # What the escrow pays: the paid seconds, and the held-back ones an
        # honest worker gets once it passes a check.
        total = sum(a["seconds"] + a.get("held_seconds", 0) * (not a.get("forfeited")) for a in acc.values()) or 1.0
        checked = sum(a.get("checks_passed", 0) for a in acc.values()) + sum(bool(a.get("forfeited")) for a in acc.values())
        rows[name] = {
            "test_accuracy": r["test_accuracy"], "rounds": r["rounds"],
            # The median round after the first (which waits for the workers to start).
            "round_s": round(statistics.median(r["round_times"][1:] or r["round_times"]), 3),
            "check_s_per_round": round(r["check_seconds"] / max(1, r["rounds"]), 4),
            "holder_cores": r["holder_cores"],
            "poisoner_share": round(acc.get("2", {}).get("seconds", 0.0) / total, 4) if hostile else None,
            "accepted": {k: v["accepted"] for k, v in acc.items()},
            "verify_rate": verify, "checks": checked,
            "replay_s_per_check": round(r.get("replay_seconds", 0) / checked, 3) if checked else None,
            "caught": bool(acc.get("2", {}).get("forfeited")) if hostile == "shirk" else None,
            "wall_s": round(time.monotonic() - t, 1)}
        print("%-34s accuracy %.4f, %d rounds of %.2f s, checks %.4f s a round, holder %.2f cores%s%s"
              % (name, r["test_accuracy"], r["rounds"], rows[name]["round_s"], rows[name]["check_s_per_round"],
                 r["holder_cores"] or 0,
                 ", %d spot checks of %.2f s" % (checked, rows[name]["replay_s_per_check"]) if checked else "",
                 ", the %s paid %.1f%% of the accepted seconds" % ("poisoner" if hostile == "scaled" else "shirker",
                                                                   100 * rows[name]["poisoner_share"])
                 if hostile else ""), flush=True)
    on, off = rows["honest, checks on"], rows["honest, checks off"]
    bad, badoff = rows["1 poisoning of 3, checks on"], rows["1 poisoning of 3, checks off"]
    von, shirk, shirkoff = rows["honest, " + spot], rows["1 shirker of 3, " + spot], rows["1 shirker of 3, spot checks off"]
    summary = {
        "verify_rate": args.verify_rate,
        "round_time_spot_checks_on_over_off": round(von["round_s"] / on["round_s"], 3),
        "replay_s_per_check": von["replay_s_per_check"],
        "spot_checks_honest": von["checks"],
        "shirker_caught": shirk["caught"],
        "shirker_share_spot_checks_on": shirk["poisoner_share"],
        "shirker_share_spot_checks_off": shirkoff["poisoner_share"],
        "shirker_minus_honest_points": round(100 * (shirk["test_accuracy"] - von["test_accuracy"]), 2),
        "check_share_of_round": round(on["check_s_per_round"] / on["round_s"], 4),
        "round_time_checks_on_over_off": round(on["round_s"] / off["round_s"], 3),
        "holder_cores_max": max(r["holder_cores"] or 0 for r in rows.values()),
        "poisoned_minus_honest_points": round(100 * (bad["test_accuracy"] - on["test_accuracy"]), 2),
        "poisoned_checks_off_accuracy": badoff["test_accuracy"],
        "poisoner_share_checks_on": bad["poisoner_share"],
        "poisoner_share_checks_off": badoff["poisoner_share"],
    }
    print()
    print("round time with the checks on over off: %.3fx (goal <= 1.05x); the checks' own time: %.1f%% of a round, "
          "on the holder's core while the workers train" % (summary["round_time_checks_on_over_off"],
                                                            100 * summary["check_share_of_round"]))
    print("holder CPU coordinating 3 workers: %.2f cores at most (goal <= 1)" % summary["holder_cores_max"])
    print("1 poisoning worker of 3, checks on: %+.2f points against all honest (goal within 0.5); checks off: "
          "accuracy %.4f" % (summary["poisoned_minus_honest_points"], summary["poisoned_checks_off_accuracy"]))
    print("share of the paid seconds to the poisoning worker: %.1f%% checks on (goal 0), %.1f%% checks off"
          % (100 * summary["poisoner_share_checks_on"], 100 * summary["poisoner_share_checks_off"]))
    print("spot checks at %g: round time %.3fx of checks alone; %d checks of the honest run, %.2f s of replay each, "
          "on the holder's core" % (args.verify_rate, summary["round_time_spot_checks_on_over_off"],
                                    summary["spot_checks_honest"], summary["replay_s_per_check"] or 0))
    print("1 shirker of 3 (a third of its update): %s; its share of the paid seconds %.1f%% with spot checks, "
          "%.1f%% without" % ("caught" if summary["shirker_caught"] else "NOT caught",
                              100 * summary["shirker_share_spot_checks_on"],
                              100 * summary["shirker_share_spot_checks_off"]))
    os.makedirs(args.out, exist_ok=True)
    doc = {"machines": "holder pinned to CPU 0 (1 core), 3 workers pinned together to CPU 1 (1/3 core each), "
                       "processes on loopback", "model": args.model, "epochs": args.epochs,
           "steps_per_epoch": args.steps, "sync_every": args.sync_every, "rows": rows, "summary": summary}
    with open(os.path.join(args.out, "held.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "held.md"), "w") as f:
        f.write("# Held DiLoCo: the holder's checks (`make bench-held`)\n\n")
        f.write("%s; train.py --model %s, %d epochs of %d steps a worker, sync every %d, int8.\n\n"
                % (doc["machines"], args.model, args.epochs, args.steps, args.sync_every))
        f.write("| setting | test accuracy | rounds | round (s) | checks a round (s) | holder cores | spot checks "
                "(replay s each) | hostile worker's share |\n")
        f.write("|---|---|---|---|---|---|---|---|\n")
        for name, r in rows.items():
            f.write("| %s | %.4f | %d | %.3f | %.4f | %.2f | %s | %s |\n" % (
                name, r["test_accuracy"], r["rounds"], r["round_s"], r["check_s_per_round"], r["holder_cores"] or 0,
                "%d (%.2f)" % (r["checks"], r["replay_s_per_check"]) if r["checks"] else "",
                "" if r["poisoner_share"] is None else "%.1f%%" % (100 * r["poisoner_share"])))
        f.write("\nround time checks on/off %.3fx (goal <= 1.05x; the checks' own time, %.1f%% of a round, runs on "
                "the holder's core while the workers train); holder %.2f cores "
                "at most (goal <= 1); one poisoner of 3: %+.2f points against honest (goal within 0.5), %.4f with "
                "the checks off; poisoner's share of the paid seconds %.1f%% (goal 0), %.1f%% with the checks off.\n"
                % (summary["round_time_checks_on_over_off"], 100 * summary["check_share_of_round"],
                   summary["holder_cores_max"], summary["poisoned_minus_honest_points"],
                   summary["poisoned_checks_off_accuracy"], 100 * summary["poisoner_share_checks_on"],
                   100 * summary["poisoner_share_checks_off"]))
        f.write("\nSpot checks at rate %g: round time %.3fx of the checks alone (the replay runs on the holder's core "
                "beside them), %d checks in the honest run at %.2f s of replay each; one shirker of 3 (a third of its "
                "update: the work of fewer steps than it says, which the checks accept) was %s, and its share of the "
                "paid seconds was %.1f%% with spot checks, %.1f%% without (%+.2f points of accuracy against honest).\n"
                % (args.verify_rate, summary["round_time_spot_checks_on_over_off"], summary["spot_checks_honest"],
                   summary["replay_s_per_check"] or 0, "caught" if summary["shirker_caught"] else "not caught",
                   100 * summary["shirker_share_spot_checks_on"], 100 * summary["shirker_share_spot_checks_off"],
                   summary["shirker_minus_honest_points"]))
    print("wrote %s" % os.path.join(args.out, "held.md"))


if __name__ == "__main__":
    main()
