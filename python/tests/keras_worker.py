"""One DiLoCo worker for the tests: a small tf_keras classifier on synthetic data.

Prints one line per round ("round R digest D") and at the end
"final round R digest D"; writes OUT/final.npz (the weights) and the
callback's OUT/worker-RANK.json. --step-sleep stands for a slower model, so
that a test can kill a worker in the middle of the job.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_USE_LEGACY_KERAS"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--peers", required=True, help="comma-separated host:port, one per rank")
    p.add_argument("--out", required=True)
    p.add_argument("--sync-every", type=int, default=10)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--compress", default="int8")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--overlap", action="store_true")
    a = p.parse_args()

    import tensorflow as tf
    import tf_keras as keras
    import deepmarket.train as dmt

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    # The same data set on every worker, shuffled differently on each.
    rng = np.random.default_rng(7)
    w_true = rng.standard_normal((20, 4)).astype(np.float32)
    x = rng.standard_normal((4096, 20)).astype(np.float32)
    y = np.argmax(x @ w_true, axis=1)
    keras.utils.set_random_seed(a.rank + 1)  # different initial weights: the job must agree on one
    ds = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096, seed=a.rank).repeat().batch(32))
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

    diloco = dmt.DiLoCo(sync_every=a.sync_every, compress=a.compress, rounds=a.rounds, rank=a.rank, overlap=a.overlap,
                        peers=a.peers.split(","), checkpoint_dir=a.out, timeout=a.timeout,
                        join_timeout=30, connect_timeout=5)

    class Report(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            print("joined round %d digest %s" % (diloco.round, dmt.digest(diloco.averager.theta)), flush=True)

        def on_train_batch_end(self, batch, logs=None):
            if diloco.synced:
                print("round %d digest %s" % (diloco.round, dmt.digest(diloco.averager.theta)), flush=True)
            if a.step_sleep:
                time.sleep(a.step_sleep)

    model.fit(ds, epochs=1, steps_per_epoch=a.sync_every * a.rounds, callbacks=[diloco, Report()], verbose=0)
    weights = model.get_weights()
    flat = np.concatenate([w.ravel() for w in weights]).astype(np.float32)
    loss, acc = model.evaluate(x, y, verbose=0, batch_size=1024)
    np.savez(os.path.join(a.out, "final.npz"), *weights)
    print("final round %d digest %s accuracy %.4f" % (diloco.round, dmt.digest(flat), acc), flush=True)


if __name__ == "__main__":
    main()
