"""Statistical efficiency: the steps each worker needs to reach a test
accuracy with k workers, simulated in one process (no network).

    python -m deepmarket.stateff --workers 1,2,4,8 --target 0.90 \\
        --out bench/results/training/stateff.json

What a distributed job buys is fewer steps per worker to the target; how
many fewer depends on the statistics, not on the machines. This harness
measures it for the Fashion-MNIST example's model, data and optimizer
(examples/fashion-mnist/train.py: build_model, load_data, Adam) with the
same seed every time, so a row is the same on every run (TensorFlow's op
determinism is on):

  sync    k workers all-reduce their gradients every step: one model trained
          on the global batch (k x the per-worker batch), the learning rate
          scaled to it (--scale linear: x k, sqrt: x sqrt(k)) after a linear
          warm-up from the 1-worker rate over --warmup steps (Goyal et al.,
          2017). A step of k workers is one step of this model.
  diloco  k replicas, each with its own Adam state and its own shuffle of the
          data (seed + rank, as train.py gives each worker), train
          --sync-every steps; their pseudo-gradients (global weights minus
          their own) go through the job's codec (int8 by default), are
          averaged and applied by the outer SGD with Nesterov momentum
          (deepmarket.train.outer_step, the function the workers run); every
          replica starts the next round from the new global weights. The
          exchange is taken as instant (no overlap): a real job that
          overlaps the exchange applies each round's average a few steps
          late.

The test accuracy of the (global) model is evaluated on the whole test set
every --eval-every steps a worker (diloco: at the end of each round), and a
row stops at the target or after --max-steps. "Steps to target" is a
worker's steps at the first evaluation at or above the target; the table
gives each row's ratio to 1 worker, which is what the scheduler multiplies
the 1-worker steps by (scheduler/stateff.json, written with --go-table).

Needs TensorFlow, tf_keras and numpy (the job environment's Python).
"""

import argparse
import importlib.util
import json
import math
import os
import sys
import time

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TRAIN_PY = os.path.join(REPO, "examples", "fashion-mnist", "train.py")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workers", default="1,2,4,8", help="worker counts k")
    p.add_argument("--modes", default="sync,diloco", help="sync, diloco or both")
    p.add_argument("--target", type=float, default=0.90, help="target test accuracy")
    p.add_argument("--model", default="cnn-wide", help="train.py --model")
    p.add_argument("--data", default=os.environ.get("DM_DATA_DIR") or "/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--learning-rate", type=float, default=DEFAULTS["learning_rate"], help="1-worker Adam learning rate")
    p.add_argument("--scale", default=DEFAULTS["lr_scale"], help="sync: learning-rate scaling to the global batch, "
                   "comma-separated among linear, sqrt, none")
    p.add_argument("--warmup", type=int, default=DEFAULTS["warmup_steps"], help="sync: warm-up steps to the scaled rate")
    p.add_argument("--sync-every", default=str(DEFAULTS["sync_every"]), help="diloco: inner steps a round (comma-separated to sweep)")
    p.add_argument("--outer-lr", default=str(DEFAULTS["outer_lr"]), help="diloco: outer learning rate(s)")
    p.add_argument("--outer-momentum", default=str(DEFAULTS["outer_momentum"]), help="diloco: outer Nesterov momentum(s)")
    p.add_argument("--inner-lr", default="", help="diloco: inner Adam learning rate(s) (default --learning-rate)")
    p.add_argument("--compress", default=DEFAULTS["compress"], help="diloco: int8, fp16 or none")
    p.add_argument("--eval-every", type=int, default=50, help="sync: evaluate every this many steps")
    p.add_argument("--max-steps", type=int, default=6000, help="steps a worker takes at most")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=0, help="TensorFlow threads (0: all cores)")
    p.add_argument("--out", default="", help="write the rows as JSON here (merged with the rows already there)")
    p.add_argument("--go-table", default="", help="write the scheduler's table (steps ratios) here")
    p.add_argument("--md", default="", help="write the rows (all of --out's) as a Markdown table here")
    p.add_argument("--report-only", action="store_true", help="run nothing: write --go-table and --md from --out")
    a = p.parse_args(argv)
    a.workers = [int(x) for x in a.workers.split(",") if x]
    a.modes = [m for m in a.modes.split(",") if m]
    a.scale = [s for s in a.scale.split(",") if s]
    floats = lambda s: [float(x) for x in s.split(",") if x]
    a.sync_every = [int(x) for x in a.sync_every.split(",") if x]
    a.outer_lr, a.outer_momentum = floats(a.outer_lr), floats(a.outer_momentum)
    a.inner_lr = floats(a.inner_lr) or [a.learning_rate]
    for k in a.workers:
        if k < 1:
            p.error("--workers: want counts of at least 1")
    for m in a.modes:
        if m not in ("sync", "diloco"):
            p.error("--modes: want sync and/or diloco, not %r" % m)
    for s in a.scale:
        if s not in ("linear", "sqrt", "none"):
            p.error("--scale: want linear, sqrt or none, not %r" % s)
    if not 0 < a.target <= 1:
        p.error("--target must be in (0, 1]")
    return a


# DEFAULTS are the settings train.py runs with unless told otherwise (its
# argparse defaults; python/tests/test_stateff.py keeps them equal): the
# scheduler's table is made of the rows run with them, so that what it
# predicts is what a job with the defaults does.
DEFAULTS = {"learning_rate": 3e-3, "lr_scale": "sqrt", "warmup_steps": 200,
            "sync_every": 50, "outer_lr": 0.7, "outer_momentum": 0.9, "compress": "int8"}


def is_default(row, d=DEFAULTS):
    """Whether a row ran with the settings d, DEFAULTS unless given (a
    1-worker row: at the default rate)."""
    if row["mode"] == "sync":
        if row.get("lr") != d["learning_rate"]:
            return False
        return row["workers"] == 1 or (row["scale"] == d["lr_scale"] and row["warmup"] == d["warmup_steps"])
    return (row["sync_every"] == d["sync_every"] and row["outer_lr"] == d["outer_lr"]
            and row["outer_momentum"] == d["outer_momentum"] and row["inner_lr"] == d["learning_rate"]
            and row["compress"] == d["compress"])


def load_train_py():
    spec = importlib.util.spec_from_file_location("dm_example_train", TRAIN_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Sim:
    """Sim holds the data, the model builder and the evaluation."""

    def __init__(self, a):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        import numpy as np
        import tensorflow as tf
        import tf_keras as keras
        if a.threads:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(a.threads)
                tf.config.threading.set_inter_op_parallelism_threads(a.threads)
            except RuntimeError:
                pass  # TensorFlow already started in this process (a test run): its threads stay
        tf.config.experimental.enable_op_determinism()
        self.np, self.tf, self.keras, self.a = np, tf, keras, a
        self.train = load_train_py()
        (self.x, self.y), (self.xt, self.yt) = self.train.load_data(a.data)
        self.xt_t = tf.constant(self.xt)
        self.yt_t = tf.constant(self.yt)
        self.loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def model(self, seed):
        self.keras.utils.set_random_seed(seed)
        return self.train.build_model(self.keras, self.a.model)

    def step_fn(self, model, opt):
        tf, loss = self.tf, self.loss

        @tf.function(jit_compile=False)
        def step(x, y):
            with tf.GradientTape() as tape:
                l = loss(y, model(x, training=True))
            opt.apply_gradients(zip(tape.gradient(l, model.trainable_variables), model.trainable_variables))
            return l
        return step

    def evaluator(self, model):
        tf = self.tf

        @tf.function
        def correct(x, y):
            return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(model(x, training=False), axis=1), y), tf.int32))

        def acc():
            n = 0
            for i in range(0, len(self.xt), 2000):
                n += int(correct(self.xt_t[i:i + 2000], self.yt_t[i:i + 2000]))
            return n / len(self.xt)
        return acc

    def batches(self, rank, batch):
        """Yields (x, y) batches of one worker's own shuffle, epoch after epoch."""
        np = self.np
        rng = np.random.default_rng(self.a.seed + rank)
        while True:
            perm = rng.permutation(len(self.x))
            for i in range(0, len(perm) - batch + 1, batch):
                idx = perm[i:i + batch]
                yield self.x[idx], self.y[idx]

    def run_sync(self, k, scale):
        a, tf = self.a, self.tf
        model = self.model(a.seed)
        factor = {"linear": k, "sqrt": math.sqrt(k), "none": 1}[scale]
        top = a.learning_rate * factor
        opt = self.keras.optimizers.Adam(learning_rate=a.learning_rate)
        lr = opt.learning_rate  # a variable: assigning it changes the traced step's rate
        step, acc = self.step_fn(model, opt), self.evaluator(model)
        data = self.batches(0, a.batch_size * k)
        curve, t0 = [], time.time()
        for s in range(1, a.max_steps + 1):
            if k > 1 and a.warmup > 0:
                lr.assign(a.learning_rate + (top - a.learning_rate) * min(1.0, s / a.warmup))
            elif k > 1:
                lr.assign(top)
            x, y = next(data)
            step(x, y)
            if s % a.eval_every == 0 or s == a.max_steps:
                curve.append((s, acc()))
                if curve[-1][1] >= a.target:
                    break
        return dict(mode="sync", workers=k, scale=scale if k > 1 else "none", lr=a.learning_rate,
                    peak_lr=top if k > 1 else a.learning_rate, warmup=a.warmup if k > 1 else 0,
                    **self.outcome(curve, k, t0))

    def run_diloco(self, k, sync_every, outer_lr, outer_momentum, inner_lr):
        a, np = self.a, self.np
        sys.path.insert(0, os.path.join(REPO, "python"))
        from deepmarket.train import outer_step
        from deepmarket.train import codec as codecs
        models, steps = [], []
        for r in range(k):
            m = self.model(a.seed)  # every worker starts from the same weights (train.py's seed)
            opt = self.keras.optimizers.Adam(inner_lr)
            models.append(m)
            steps.append(self.step_fn(m, opt))
        datas = [self.batches(r, a.batch_size) for r in range(k)]
        shapes = [w.shape for w in models[0].get_weights()]
        flat = lambda ws: np.concatenate([w.ravel() for w in ws]).astype(np.float32)

        def unflat(theta):
            out, pos = [], 0
            for sh in shapes:
                n = int(np.prod(sh))
                out.append(theta[pos:pos + n].reshape(sh))
                pos += n
            return out
        theta = flat(models[0].get_weights())
        mom = np.zeros_like(theta)
        glob = self.model(a.seed)
        acc = self.evaluator(glob)
        curve, t0, done = [], time.time(), 0
        while done < a.max_steps:
            h = min(sync_every, a.max_steps - done)
            deltas = []
            for r in range(k):
                for _ in range(h):
                    x, y = next(datas[r])
                    steps[r](x, y)
                d = theta - flat(models[r].get_weights())
                if k > 1:
                    meta, payload = codecs.encode(d, a.compress)
                    d = codecs.decode(meta, payload)
                deltas.append(d)
            done += h
            avg = np.mean(deltas, axis=0).astype(np.float32)
            if k > 1:
                theta, mom = outer_step(theta, mom, avg, outer_lr, outer_momentum)
            else:
                theta = theta - avg
            ws = unflat(theta)
            for m in models:
                m.set_weights(ws)
            glob.set_weights(ws)
            curve.append((done, acc()))
            if curve[-1][1] >= a.target:
                break
        return dict(mode="diloco", workers=k, sync_every=sync_every, outer_lr=outer_lr,
                    outer_momentum=outer_momentum, inner_lr=inner_lr, compress=a.compress,
                    **self.outcome(curve, k, t0))

    def outcome(self, curve, k, t0):
        a = self.a
        hit = next((s for s, v in curve if v >= a.target), None)
        # Every lower target on the way, from the same curve.
        steps_to = {}
        for t in sorted({0.85, 0.88, 0.89, 0.90, 0.91, 0.92, a.target}):
            if t <= a.target:
                steps_to["%.2f" % t] = next((s for s, v in curve if v >= t), None)
        return dict(target=a.target, steps_to=steps_to, batch_per_worker=a.batch_size, model=a.model, seed=a.seed,
                    steps_to_target=hit, reached=hit is not None,
                    examples_to_target=hit * k * a.batch_size if hit else None,
                    final_accuracy=curve[-1][1] if curve else None, steps_run=curve[-1][0] if curve else 0,
                    curve=[[s, round(v, 4)] for s, v in curve], wall_s=round(time.time() - t0, 1))


def key(row):
    keys = ("mode", "workers", "lr", "scale", "warmup", "sync_every", "outer_lr", "outer_momentum", "inner_lr",
            "compress", "target", "model", "batch_per_worker", "seed")
    return tuple(str(row.get(k)) for k in keys)


def merge(path, rows):
    old = []
    if path and os.path.exists(path):
        with open(path) as f:
            old = json.load(f).get("rows", [])
    by = {key(r): r for r in old}
    for r in rows:
        by[key(r)] = r
    return list(by.values())


def steps_to(row, target):
    """The steps a row took to target (None: not reached or not run that far)."""
    if "%.2f" % target in row.get("steps_to", {}):
        return row["steps_to"]["%.2f" % target]
    return row["steps_to_target"] if row["target"] == target and row["reached"] else None


def bases(rows, target, model, d=DEFAULTS):
    """Each seed's 1-worker steps to target with the defaults."""
    out = {}
    for r in rows:
        if r["model"] == model and r["workers"] == 1 and r["mode"] == "sync" and is_default(r, d):
            st = steps_to(r, target)
            if st:
                out[r["seed"]] = st
    return out


def go_table(rows, target, model, d=DEFAULTS):
    """The scheduler's table: per mode and worker count k, the steps to the
    target per worker over one worker's, from the rows run with DEFAULTS
    (one worker at the default learning rate, the best one measured: the
    baseline a researcher would run), each seed against its own 1-worker
    row, averaged over the seeds: steps to a plateau-ish target vary by a
    third from one data order to the next."""
    base = bases(rows, target, model, d)
    if not base:
        raise SystemExit("stateff: no 1-worker row with the defaults reached %.2f: nothing to scale by" % target)
    out = {"target": target, "model": model, "batch_per_worker": 64, "seeds": sorted(base),
           "one_worker_steps": round(sum(base.values()) / len(base)), "defaults": d, "modes": {}}
    for mode in ("sync", "diloco"):
        per = {}
        for r in rows:
            st = steps_to(r, target)
            if (r["mode"] != mode or r["workers"] < 2 or r["model"] != model or not is_default(r, d)
                    or r["seed"] not in base):
                continue
            if not st:
                # Not reached in at least one worker's steps: no better
                # than one worker (the table's ceiling), not unknown.
                if r.get("steps_run", 0) < base[r["seed"]]:
                    continue
                st = r["steps_run"]
            per.setdefault(r["workers"], {})[r["seed"]] = st / base[r["seed"]]  # one per seed
        pts = [{"workers": 1, "ratio": 1.0}]
        for k in sorted(per):
            per[k] = [per[k][seed] for seed in sorted(per[k])]
            mean = sum(per[k]) / len(per[k])
            pts.append({"workers": k, "ratio": round(min(1.0, max(1.0 / k, mean)), 4),
                        "seeds": len(per[k]), "ratios": [round(x, 3) for x in per[k]]})
        out["modes"][mode] = pts
    return out


def markdown(rows, target, model, table, d=DEFAULTS):
    """The rows as a Markdown report, with the scheduler's table."""
    one = table["one_worker_steps"]
    base = bases(rows, target, model, d)
    out = ["# Statistical efficiency: steps to %.2f test accuracy with k workers" % target, "",
           "`python -m deepmarket.stateff` (python/deepmarket/stateff.py): the Fashion-MNIST example's model "
           "(`%s`), data and optimizer (Adam), batch %d a worker, k workers simulated in one process with "
           "TensorFlow's op determinism (no network, no time: only steps count), the test set evaluated every 50 "
           "steps (sync) or at every round's end (diloco). Sync is one model on the global batch (k x %d) with the "
           "learning rate scaled from the 1-worker rate (linear: x k, sqrt: x sqrt k) over a 200-step warm-up; "
           "DiLoCo is k replicas with their own Adam state and data order, averaging int8-compressed "
           "pseudo-gradients every sync_every steps through the outer Nesterov SGD the workers run." % (
               model, table["batch_per_worker"], table["batch_per_worker"]), "",
           "**Ratio** is a worker's steps to the target over one worker's with the same data order (seed) at "
           "the default learning rate, %g (%s steps; the fewest of the rates tried): 1/k would be perfect "
           "scaling, 1 no gain. The steps k workers need bound their speed-up at 1/ratio, on any machines and "
           "links. Rows marked * run with the table's settings (%s; train.py's defaults unless the table says otherwise): the table is made of them, "
           "averaged over the seeds." % (
               d["learning_rate"], ", ".join("%d for seed %d" % (v, k) for k, v in sorted(base.items())),
               ", ".join("%s %s" % (k, v) for k, v in d.items())), "",
           "| Mode | k | Seed | Learning rate (peak) | Settings | Steps to %.2f | Ratio | Perfect | Examples to target | Final acc (steps run) |" % target,
           "|---|---|---|---|---|---|---|---|---|---|"]
    def settings(r):
        if r["mode"] == "sync":
            return "%s scaling, warm-up %d" % (r["scale"], r["warmup"]) if r["workers"] > 1 else "-"
        return "sync_every %d, outer lr %g, momentum %g" % (r["sync_every"], r["outer_lr"], r["outer_momentum"])
    later = [r for r in rows if r["model"] == model and r["target"] > target]
    for r in sorted(rows, key=lambda r: (r["mode"] != "sync", r["workers"], r["seed"], str(r.get("lr") or r.get("inner_lr")),
                                         settings(r))):
        if r["model"] != model or r["target"] != target:
            continue
        st = steps_to(r, target)
        lr = r.get("peak_lr", r.get("lr")) if r["mode"] == "sync" else r["inner_lr"]
        out.append("| %s%s | %d | %d | %g | %s | %s | %s | %.3f | %s | %.4f (%d) |" % (
            r["mode"], "*" if is_default(r, d) else "", r["workers"], r["seed"], lr, settings(r), st if st else "not reached",
            "%.3f" % (st / base[r["seed"]]) if st and r["seed"] in base else "-", 1 / r["workers"],
            "{:,}".format(st * r["workers"] * r["batch_per_worker"]) if st else "-",
            r["final_accuracy"], r["steps_run"]))
    if later:
        his = sorted({r["target"] for r in later})
        out += ["", "## Later targets", "",
                "Rows run on past %.2f (their steps to %.2f on the way match the rows above: the harness is "
                "deterministic). A later target does not favour more workers here: the ratio grows, and at 0.92 "
                "the larger effective batch never gets there." % (target, target), "",
                "| Mode | k | Seed | Settings | " + " | ".join("Steps to %.2f" % t for t in [target] + his) +
                " | " + " | ".join("Ratio at %.2f" % t for t in his) + " |",
                "|---|---|---|---|" + "---|" * (1 + 2 * len(his))]
        for r in sorted(later, key=lambda r: (r["target"], r["mode"] != "sync", r["workers"], settings(r))):
            cells = []
            for t in [target] + his:
                st = steps_to(r, t) if t <= r["target"] else None
                cells.append(str(st) if st else ("not reached" if t <= r["target"] else "-"))
            ratios = []
            for t in his:
                one = [x for x in later if x["workers"] == 1 and x["seed"] == r["seed"] and x["target"] >= t
                       and is_default(x, d) and steps_to(x, t)]
                st = steps_to(r, t) if t <= r["target"] else None
                ratios.append("%.3f" % (st / steps_to(one[0], t)) if st and one else "-")
            out.append("| %s | %d | %d | %s | %s | %s |" % (r["mode"], r["workers"], r["seed"], settings(r),
                                                           " | ".join(cells), " | ".join(ratios)))
    out += ["", "## The scheduler's table (scheduler/stateff.json)", "",
            "The rows run with the defaults: what `scheduler.Predict` multiplies a job's 1-worker steps by when "
            "the job gives no `[training] steps_ratio` of its own (between measured worker counts the ratio is "
            "interpolated in log k; beyond the last it stays).", "",
            "| Mode | k | Ratio (mean) | Best speed-up the statistics allow | Per seed |", "|---|---|---|---|---|"]
    for mode, pts in table["modes"].items():
        for p in pts:
            if p["workers"] > 1:
                out.append("| %s | %d | %.3f | %.2fx | %s |" % (mode, p["workers"], p["ratio"], 1 / p["ratio"],
                           ", ".join("%.3f" % x for x in p["ratios"])))
    return "\n".join(out) + "\n"


def write_reports(a, rows):
    """Writes --go-table and --md, when asked for, from rows."""
    if not (a.go_table or a.md):
        return
    # The table's settings: the defaults, or the diloco settings asked for.
    d = dict(DEFAULTS, sync_every=a.sync_every[0], outer_lr=a.outer_lr[0], outer_momentum=a.outer_momentum[0])
    table = go_table(rows, a.target, a.model, d)
    if a.go_table:
        with open(a.go_table, "w") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
    if a.md:
        with open(a.md, "w") as f:
            f.write(markdown(rows, a.target, a.model, table, d))


def main(argv=None):
    a = parse_args(argv)
    if a.report_only:
        write_reports(a, merge(a.out, []))
        return 0
    sim = Sim(a)
    rows = []

    def emit(r):
        rows.append(r)
        print("%-6s k=%d %s: %s steps to %.2f (final %.4f after %d steps), %.0fs" % (
            r["mode"], r["workers"],
            " ".join("%s=%s" % (x, r[x]) for x in ("scale", "sync_every", "outer_lr", "outer_momentum", "inner_lr")
                     if x in r),
            r["steps_to_target"] if r["reached"] else "not reached", a.target, r["final_accuracy"],
            r["steps_run"], r["wall_s"]), flush=True)
        if a.out:
            os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
            with open(a.out + ".tmp", "w") as f:
                json.dump({"rows": merge(a.out, rows)}, f, indent=1)
            os.replace(a.out + ".tmp", a.out)

    for k in a.workers:
        if "sync" in a.modes or k == 1:
            for scale in (a.scale if k > 1 else ["none"]):
                emit(sim.run_sync(k, scale))
        if "diloco" in a.modes and k > 1:
            for h in a.sync_every:
                for olr in a.outer_lr:
                    for om in a.outer_momentum:
                        for ilr in a.inner_lr:
                            emit(sim.run_diloco(k, h, olr, om, ilr))
    write_reports(a, merge(a.out, []) if a.out else rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
