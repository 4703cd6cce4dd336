"""One synchronous (MultiWorkerMirroredStrategy) worker for the tests: a
small tf_keras classifier on synthetic data, its gradients all-reduced
every step.

Prints "step N" after each step (each one --step-sleep long, so that a test
can pause a worker in the middle of the job) and "done accuracy A" at the
end. --heartbeat-timeout 0 leaves TensorFlow's coordination service at its
defaults; else deepmarket.train.sync_strategy gets it.
"""

import argparse
import json
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
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--heartbeat-timeout", type=float, default=-1, help="seconds; 0: TensorFlow's default; -1: the package's")
    a = p.parse_args()
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": a.peers.split(",")},
                                          "task": {"type": "worker", "index": a.rank}})

    import tensorflow as tf
    import tf_keras as keras
    import deepmarket.train as dmt

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if a.heartbeat_timeout == 0:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    elif a.heartbeat_timeout < 0:
        strategy = dmt.sync_strategy()
    else:
        strategy = dmt.sync_strategy(heartbeat_timeout=a.heartbeat_timeout)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 16)).astype(np.float32)
    y = (x[:, :8].sum(axis=1) > 0).astype(np.int64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)

    class Steps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            print("step %d" % (batch + 1), flush=True)
            time.sleep(a.step_sleep)

    with strategy.scope():
        m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
        m.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    h = m.fit(ds, epochs=1, steps_per_epoch=a.steps, callbacks=[Steps()], verbose=0)
    print("done accuracy %.3f" % h.history["accuracy"][-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
