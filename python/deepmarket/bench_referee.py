"""What a referee's recomputation costs beside one worker round (make bench-fair).

For the Fashion-MNIST example's models (mlp, cnn), on inputs of its shape
(28x28, 10 classes; the values are random: only the time matters): one
worker round is sync_every (20) steps of train_on_batch at batch 64, as the
example's workers take them; a referee's recomputation is the referee
program (python -m deepmarket.train.referee, as a referee's node runs it,
in a fresh process) on a refused round's evidence and a 256-example
validation batch. It prints both, the program's own evaluation time and its
whole run (Python and TensorFlow's start included), and the ratios to the
round. The issue's goal: at most one worker round a case.

    python -m deepmarket.bench_referee [--out bench/results/referee.json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np


def build(keras, name):
    if name == "mlp":
        layers = [keras.layers.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
                  keras.layers.Dense(10)]
    else:
        layers = [keras.layers.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                  keras.layers.MaxPooling2D(), keras.layers.Conv2D(32, 3, activation="relu"),
                  keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"),
                  keras.layers.Dense(10)]
    m = keras.Sequential(layers)
    m.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def measure(name, steps=20, batch=64, examples=256, tries=3):
    from .train import evidence
    from .train.keras_callback import _flatten, _keras
    rng = np.random.default_rng(0)
    shape = (28, 28) if name == "mlp" else (28, 28, 1)
    m = build(_keras, name)
    x = rng.random((steps * batch,) + shape, dtype=np.float32)
    y = rng.integers(0, 10, steps * batch)
    m.train_on_batch(x[:batch], y[:batch])  # the graph built once, as a running worker has it
    theta = _flatten(m.get_weights())
    rounds = []
    for _ in range(tries):
        t = time.monotonic()
        for s in range(steps):
            m.train_on_batch(x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch])
        rounds.append(time.monotonic() - t)
    update = theta - _flatten(m.get_weights())
    with tempfile.TemporaryDirectory() as d:
        desc = evidence.model_description(m)
        ev = evidence.save(os.path.join(d, "ev"), 3, theta, None, update, steps, desc)
        val = os.path.join(d, "validation.npz")
        np.savez(val, x=rng.random((examples,) + shape, dtype=np.float32), y=rng.integers(0, 10, examples))
        case = os.path.join(d, "case.json")
        with open(case, "w") as f:
            json.dump({"theta": evidence.digest(theta), "prev": "", "update": evidence.digest(update),
                       "model": evidence.model_digest(desc), "tolerance": 10.0, "echo": 0.98, "residual": 0.9}, f)
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        walls, evals = [], []
        for _ in range(tries):
            t = time.monotonic()
            out = subprocess.run([sys.executable, "-m", "deepmarket.train.referee", "--case", case, "--evidence", ev,
                                  "--validation", val], capture_output=True, text=True, env=env, timeout=300)
            walls.append(time.monotonic() - t)
            if out.returncode != 0:
                raise SystemExit("the referee program failed: %s" % out.stderr[-2000:])
            evals.append(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])
    r, w, e = float(np.median(rounds)), float(np.median(walls)), float(np.median(evals))
    return {"model": name, "params": int(theta.size), "round_s": round(r, 4), "referee_eval_s": round(e, 4),
            "referee_wall_s": round(w, 3), "eval_over_round": round(e / r, 3), "wall_over_round": round(w / r, 2)}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m deepmarket.bench_referee", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write the results (JSON) here")
    a = p.parse_args(argv)
    rows = [measure(name) for name in ("mlp", "cnn")]
    print("%-5s %9s %10s %16s %16s %12s %12s" % ("model", "params", "round s", "referee eval s", "referee all s",
                                                 "eval/round", "all/round"))
    for r in rows:
        print("%-5s %9d %10.3f %16.3f %16.2f %12.3f %12.1f" % (r["model"], r["params"], r["round_s"],
                                                              r["referee_eval_s"], r["referee_wall_s"],
                                                              r["eval_over_round"], r["wall_over_round"]))
    met = all(r["eval_over_round"] <= 1 for r in rows)
    print("goal: a referee's recomputation costs at most one worker round: %s (its evaluations; the program's start, "
          "Python and TensorFlow, is a fixed %0.1f-%0.1f s a case)" % (met, min(r["referee_wall_s"] for r in rows),
                                                                     max(r["referee_wall_s"] for r in rows)))
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"rows": rows, "met": met, "setup": "one worker round: 20 steps of batch 64 (train_on_batch, "
                       "median of 3); referee: the program in a fresh process on a 256-example batch; random inputs "
                       "of Fashion-MNIST's shape; 2-core machine",
                       "command": "python -m deepmarket.bench_referee"}, f, indent=2)


if __name__ == "__main__":
    main()
