#!/usr/bin/env python3
"""Distributed Fashion-MNIST training, synchronous or DiLoCo.

--mode sync (the default): tf.distribute.MultiWorkerMirroredStrategy, the
gradients all-reduced after every step. The cluster comes from the TF_CONFIG
environment variable, read by TensorFlow itself (nothing here changes how TF
interprets it). Without TF_CONFIG the program trains as a single worker.

--mode diloco: every worker trains plain single-worker Keras on its own
shuffle of the data and, every --sync-every steps, averages its progress with
the others through deepmarket.train.DiLoCo (compressed, over one TCP port per
worker; a lost worker does not stop the others). Peers come from DM_RANK and
DM_AVG_PEERS (else TF_CONFIG with each port + 1000). With DM_AVG_HOLDER (a
job whose [training] holder is "submitter") the submitter's node runs this
program once more with DM_ROLE=holder: that process keeps the model, checks
every worker's update on a validation batch of its own data, evaluates and
saves the model (deepmarket.train.KerasHolder); the workers only train.

Every worker runs this same program; worker 0 (or "chief"), or the holder,
writes OUT/model.keras and OUT/result.json. --target-accuracy stops the run once
the test accuracy reaches it and records how long that took.

Data: the four Fashion-MNIST IDX files (gzipped or plain) in --data, parsed
with numpy; nothing is downloaded.

A restarted job resumes: in sync mode from its last finished epoch thanks to
keras.callbacks.BackupAndRestore (OUT/backup on the chief); in diloco mode
from the last round, through the live workers or OUT/diloco-state.npz.
"""

import time

T_START = time.time()

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras -> tf_keras (see main())

import numpy as np

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Train a small classifier on Fashion-MNIST, on one or more "
                    "workers (tf.distribute.MultiWorkerMirroredStrategy; cluster "
                    "from TF_CONFIG, single worker without it).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", default=os.environ.get("DM_DATA_DIR") or DEFAULT_DATA,
                   help="directory with train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
                        "t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz] "
                        "(default: $DM_DATA_DIR, else %s)" % DEFAULT_DATA)
    p.add_argument("--out", default=os.environ.get("DM_OUTPUT_DIR") or "./out",
                   help="output directory: model.keras, result.json, backup/ "
                        "(default: $DM_OUTPUT_DIR, else ./out)")
    p.add_argument("--epochs", type=int, default=2, help="number of epochs")
    p.add_argument("--steps-per-epoch", type=int, default=None,
                   help="training steps per epoch (default: one full pass over the training set)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="batch size per worker (global batch = this x workers)")
    p.add_argument("--train-examples", type=int, default=None,
                   help="use only the first N training examples (for quick tests)")
    p.add_argument("--model", choices=["mlp", "cnn", "cnn-wide", "cnn-deep"], default="mlp",
                   help="mlp: Flatten+Dense(128)+Dense(10); cnn: a tiny conv net (slower, more accurate); "
                        "cnn-wide: a wider conv net, compute-bound (a step of 64 takes 50+ ms on a core), "
                        "reaches 0.90 test accuracy; cnn-deep: three blocks of two convolutions, "
                        "7x cnn-wide's arithmetic for the same 0.4M weights")
    p.add_argument("--learning-rate", type=float, default=3e-3,
                   help="Adam learning rate of one worker (3e-3 reaches 0.90 in the fewest steps of 1e-3 to 6e-3: "
                        "bench/results/training/stateff.md)")
    p.add_argument("--lr-scale", choices=["linear", "sqrt", "none"], default=os.environ.get("DM_LR_SCALE") or "sqrt",
                   help="sync with k workers: scale the learning rate to the global batch (linear: x k, sqrt: "
                        "x sqrt(k), the rule for Adam), reached after --warmup-steps; sqrt reaches 0.90 in fewer "
                        "steps from 3 workers up (bench/results/training/stateff.md)")
    p.add_argument("--warmup-steps", type=int, default=int(os.environ.get("DM_WARMUP_STEPS") or 200),
                   help="sync with k workers: steps from the 1-worker learning rate to the scaled one")
    p.add_argument("--seed", type=int, default=42, help="random seed (same on every worker)")
    env = os.environ
    p.add_argument("--mode", choices=["sync", "diloco"], default=env.get("DM_TRAINING_MODE") or "sync",
                   help="sync: all-reduce gradients every step (MultiWorkerMirroredStrategy); "
                        "diloco: local steps, averaged every --sync-every steps (deepmarket.train.DiLoCo)")
    p.add_argument("--sync-every", type=int, default=int(env.get("DM_SYNC_EVERY") or 50),
                   help="diloco: inner steps between averaging rounds (50 reaches 0.90 in fewer steps than 100 "
                        "with 2, 4 and 8 workers: bench/results/training/stateff.md)")
    p.add_argument("--compress", choices=["int8", "fp16", "none"], default=env.get("DM_COMPRESS") or "int8",
                   help="diloco: compression of what workers exchange")
    p.add_argument("--outer-lr", type=float, default=0.7, help="diloco: outer SGD learning rate")
    p.add_argument("--outer-momentum", type=float, default=0.9, help="diloco: outer Nesterov momentum")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                   help="diloco: keep training while a round's exchange is on the wire (hides the link's latency)")
    p.add_argument("--join-timeout", type=float, default=120.0,
                   help="diloco: how long the first round waits for every worker to join (and a worker for "
                        "the job to answer), in seconds")
    p.add_argument("--round-timeout", type=float, default=60.0,
                   help="diloco: how long a round waits for a silent worker, in seconds")
    p.add_argument("--check-examples", type=int, default=512,
                   help="diloco, held: the training examples the holder checks every update on")
    p.add_argument("--write-validation", metavar="FILE", default=None,
                   help="write the holder's validation batch (--check-examples training examples, as x and y "
                        "in an .npz) to FILE and exit: name it in the job's [training] validation, and the "
                        "holder checks on it by its content address")
    p.add_argument("--no-checks", action="store_true",
                   help="diloco, held: the holder averages every update unchecked (to measure what the checks do)")
    p.add_argument("--verify-rate", type=float, default=float(env.get("DM_VERIFY_RATE") or 0),
                   help="diloco, held: the share of accepted rounds the holder replays to check them "
                        "(spot checks, a job's [verify] rate; 0: none)")
    p.add_argument("--verify-share", type=float, default=float(env.get("DM_VERIFY_SHARE") or 0.2),
                   help="diloco, held: the share of a worker's pay held back until it passes a spot check")
    p.add_argument("--verify-tolerance", type=float, default=float(env.get("DM_VERIFY_TOLERANCE") or 0.1),
                   help="diloco, held: how far (relative) an update may be from its replay")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="stop once the test accuracy reaches this (checked every --eval-every steps, "
                        "else every epoch) and record the time to it")
    p.add_argument("--eval-every", type=int, default=None,
                   help="with --target-accuracy: evaluate every this many steps per worker "
                        "(diloco: at the first round end after them; default: every epoch)")
    a = p.parse_args(argv)
    if a.warmup_steps < 0:
        p.error("--warmup-steps must be >= 0")
    for name in ("epochs", "batch_size", "sync_every"):
        if getattr(a, name) < 1:
            p.error("--%s must be >= 1" % name.replace("_", "-"))
    if a.target_accuracy is not None and not 0 < a.target_accuracy <= 1:
        p.error("--target-accuracy must be in (0, 1]")
    if a.eval_every is not None and a.eval_every < 1:
        p.error("--eval-every must be >= 1")
    if a.steps_per_epoch is not None and a.steps_per_epoch < 1:
        p.error("--steps-per-epoch must be >= 1")
    if a.train_examples is not None and a.train_examples < 1:
        p.error("--train-examples must be >= 1")
    for name in ("verify_rate", "verify_share"):
        if not 0 <= getattr(a, name) <= 1:
            p.error("--%s must be in [0, 1]" % name.replace("_", "-"))
    if not a.verify_tolerance > 0:
        p.error("--verify-tolerance must be > 0")
    if a.verify_rate > 0:  # the workers' DiLoCo commits to its state each round
        os.environ["DM_VERIFY_RATE"] = repr(a.verify_rate)
    return a


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- IDX reading

def find_idx(data_dir, name):
    for cand in (name, name + ".gz"):
        path = os.path.join(data_dir, cand)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError("%s[.gz] not found in %s" % (name, data_dir))


def read_idx(path):
    """Reads an IDX file (optionally gzipped) into a numpy array of uint8."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError("%s: not an IDX file (bad magic)" % path)
    if raw[2] != 0x08:
        raise ValueError("%s: IDX element type 0x%02x, expected 0x08 (unsigned byte)" % (path, raw[2]))
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    count = int(np.prod(shape)) if shape else 0
    if len(raw) - header != count:
        raise ValueError("%s: header says %s (%d bytes), file has %d data bytes"
                         % (path, shape, count, len(raw) - header))
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load_data(data_dir, train_examples=None):
    arr = {k: read_idx(find_idx(data_dir, v)) for k, v in FILES.items()}
    for split in ("train", "test"):
        x, y = arr[split + "_images"], arr[split + "_labels"]
        if x.ndim != 3 or x.shape[1:] != (28, 28) or y.ndim != 1 or len(x) != len(y):
            raise ValueError("%s: unexpected shapes images %s labels %s" % (split, x.shape, y.shape))
    x_train, y_train = arr["train_images"], arr["train_labels"]
    if train_examples is not None:
        x_train, y_train = x_train[:train_examples], y_train[:train_examples]
    prep = lambda x: (x.astype(np.float32) / 255.0)[..., None]
    return (prep(x_train), y_train.astype(np.int64)), (prep(arr["test_images"]), arr["test_labels"].astype(np.int64))


# ---------------------------------------------------------------- cluster role

def cluster_size(tf_config):
    """The number of tasks in TF_CONFIG's cluster (0 without one)."""
    if not tf_config:
        return 0
    try:
        cluster = json.loads(tf_config).get("cluster") or {}
    except (ValueError, AttributeError):
        return 2  # not ours to judge: MultiWorkerMirroredStrategy reports a bad TF_CONFIG
    return sum(len(v) for v in cluster.values() if isinstance(v, list))


def is_chief(resolver):
    task_type = getattr(resolver, "task_type", None)
    task_id = getattr(resolver, "task_id", None)
    if task_type is None:
        return True
    if task_type == "chief":
        return True
    cluster = resolver.cluster_spec().as_dict() if resolver else {}
    return task_type == "worker" and task_id == 0 and "chief" not in cluster


def sync_backup_from_chief(tf, strategy, backup_dir, chief, tag):
    """Gives every worker the chief's BackupAndRestore checkpoint.

    tf_keras' BackupAndRestore restores every worker from BACKUP/chief/, which
    only the chief writes: that assumes all workers share one OUT folder. When
    each worker has its own OUT (separate machines), a restarted job would
    have the chief resume while the others start over, and the collectives
    then fail. So before fit() the chief's checkpoint files are sent to all
    workers through the cluster's own all-reduce (non-chief workers add
    zeros), and each worker's BACKUP/chief/ is made identical to the chief's.
    Returns (the chief has a checkpoint, this worker wrote a copy of it).
    """
    src = os.path.join(backup_dir, "chief")

    def broadcast(arr):
        # Sum of the chief's int32 array and zeros from everyone else.
        arr = np.asarray(arr, dtype=np.int32)
        out = strategy.reduce(tf.distribute.ReduceOp.SUM,
                              strategy.run(lambda: tf.constant(arr)), axis=None)
        return out.numpy()

    blob = b""
    if chief and os.path.isdir(src):
        files = {n: open(os.path.join(src, n), "rb").read()
                 for n in sorted(os.listdir(src)) if os.path.isfile(os.path.join(src, n))}
        if files:
            header = json.dumps({n: len(b) for n, b in files.items()}).encode()
            blob = len(header).to_bytes(8, "big") + header + b"".join(files.values())
    size = int(broadcast([len(blob) if chief else 0])[0])
    if size == 0:
        # No checkpoint on the chief: nobody may restore (drop stale copies).
        if not chief and os.path.isdir(src):
            log("%s dropping a stale checkpoint copy: the chief has none" % tag)
            shutil.rmtree(src, ignore_errors=True)
        return False, False
    padded = (size + 3) // 4 * 4
    words = (np.frombuffer(blob.ljust(padded, b"\0"), dtype=np.int32) if chief
             else np.zeros(padded // 4, dtype=np.int32))
    data = broadcast(words).astype(np.int32).tobytes()[:size]
    if not chief:
        hlen = int.from_bytes(data[:8], "big")
        sizes = json.loads(data[8:8 + hlen])
        os.makedirs(src, exist_ok=True)
        pos, changed = 8 + hlen, 0
        for name, n in sizes.items():
            content, path = data[pos:pos + n], os.path.join(src, name)
            pos += n
            try:
                same = open(path, "rb").read() == content  # shared OUT: the chief's own file
            except OSError:
                same = False
            if not same:
                with open(path + ".tmp", "wb") as f:
                    f.write(content)
                os.replace(path + ".tmp", path)
                changed += 1
        for name in os.listdir(src):
            if name not in sizes and os.path.isfile(os.path.join(src, name)):
                os.remove(os.path.join(src, name))
        if changed:
            log("%s received the chief's checkpoint (%d bytes)" % (tag, size))
        return True, changed > 0
    return True, False


def build_model(keras, name):
    if name == "cnn":
        layers = [keras.Input((28, 28, 1)),
                  keras.layers.Conv2D(16, 3, activation="relu"),
                  keras.layers.MaxPooling2D(),
                  keras.layers.Conv2D(32, 3, activation="relu"),
                  keras.layers.MaxPooling2D(),
                  keras.layers.Flatten(),
                  keras.layers.Dense(64, activation="relu"),
                  keras.layers.Dense(10)]
    elif name == "cnn-wide":
        # Most of the time goes to the convolutions (compute-bound): the
        # model has 0.4M weights, so averaging it costs little next to a step.
        layers = [keras.Input((28, 28, 1)),
                  keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                  keras.layers.MaxPooling2D(),
                  keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
                  keras.layers.MaxPooling2D(),
                  keras.layers.Flatten(),
                  keras.layers.Dense(128, activation="relu"),
                  keras.layers.Dense(10)]
    elif name == "cnn-deep":
        # Seven times cnn-wide's arithmetic a step for about the same 0.4M
        # weights (three VGG-style blocks of two 3x3 convolutions): a worker
        # computes far longer than it takes to exchange the model.
        layers = [keras.Input((28, 28, 1))]
        for filters in (32, 64, 128):
            layers += [keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
                       keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
                       keras.layers.MaxPooling2D()]
        layers += [keras.layers.Flatten(),
                   keras.layers.Dense(128, activation="relu"),
                   keras.layers.Dense(10)]
    else:
        layers = [keras.Input((28, 28, 1)),
                  keras.layers.Flatten(),
                  keras.layers.Dense(128, activation="relu"),
                  keras.layers.Dense(10)]
    return keras.Sequential(layers, name="fashion_mnist_" + name.replace("-", "_"))


def import_deepmarket(module="train"):
    """deepmarket.<module>, installed in the job's environment or, when
    this runs from a checkout of the repository, from its python/ folder."""
    import importlib
    try:
        return importlib.import_module("deepmarket." + module)
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        checkout = os.path.normpath(os.path.join(here, "..", "..", "python"))
        if not os.path.isfile(os.path.join(checkout, "deepmarket", "__init__.py")):
            raise
        sys.path.insert(0, checkout)
        return importlib.import_module("deepmarket." + module)


def sync_strategy(tf):
    """MultiWorkerMirroredStrategy, patient with a worker whose machine
    stalls (deepmarket.train.sync_strategy); TensorFlow's own, which fails
    the job after 10 s without a worker's heartbeat, where the package is
    missing (a run by hand)."""
    try:
        dmt = import_deepmarket()
    except ImportError:
        return tf.distribute.MultiWorkerMirroredStrategy()
    return dmt.sync_strategy()


def progress_reporter(keras):
    """The deepmarket package's progress callback: the machine this runs on
    reports the job's progress to the submitter, which pays for progress
    (stall_after). None where the package is missing (a run by hand)."""
    try:
        progress = import_deepmarket("progress")
    except ImportError:
        return None
    progress.report(0, force=True)  # started
    return progress.keras_callback(keras)


def train_batches(tf, x_train, y_train, seed, batch):
    """The training batches of a worker whose shuffle seed is seed: every
    worker reads the whole set in its own order (diloco: a worker lost or
    added changes nothing about what the others read)."""
    return (tf.data.Dataset.from_tensor_slices((x_train, y_train))
            .shuffle(min(len(x_train), 10000), seed=seed, reshuffle_each_iteration=True)
            .repeat()
            .batch(batch, drop_remainder=True))


def validation_pick(args, x_train, y_train):
    """The holder's own validation batch: --check-examples training
    examples, picked with --seed."""
    import numpy as np

    rng = np.random.default_rng(args.seed + 7)
    pick = rng.choice(len(x_train), size=min(args.check_examples, len(x_train)), replace=False)
    return x_train[pick], y_train[pick]


def hold(args, tf, keras, dmt, model, x_train, y_train, test_ds, rounds, steps, workers, tag, local_batch):
    """The holder's side of a held diloco job: keeps the model, checks the
    workers' updates on --check-examples training examples of its own, and
    evaluates every --eval-every steps (else every epoch). With spot checks
    it replays a worker's round on the batches that worker's pipeline gives."""
    def batches(rank, cursor, n):
        ds = train_batches(tf, x_train, y_train, args.seed + rank, local_batch)
        return ds.skip(cursor).take(n).as_numpy_iterator()

    x_check, y_check = validation_pick(args, x_train, y_train)  # the bid's batch instead, when it names one
    per_round = args.sync_every
    every = max(1, (args.eval_every or steps) // per_round)

    def evaluate(m):
        return m.evaluate(test_ds, verbose=0)

    holder = dmt.KerasHolder(model, x_check, y_check, rounds, evaluate=evaluate, eval_every=every,
                             target=args.target_accuracy, sync_every=args.sync_every,
                             compress=args.compress, outer_lr=args.outer_lr, outer_momentum=args.outer_momentum,
                             checks=not args.no_checks, join_timeout=args.join_timeout,
                             timeout=args.round_timeout, out_dir=args.out, log=lambda m: log("%s %s" % (tag, m)),
                             batches=batches, verify_rate=args.verify_rate, verify_share=args.verify_share,
                             verify_tolerance=args.verify_tolerance)
    t_fit = time.time()
    summary = holder.run()
    test_loss, test_acc = model.evaluate(test_ds, verbose=0)
    log("%s test: loss %.4f accuracy %.4f" % (tag, test_loss, test_acc))
    try:  # the job's result, as the submitter's node shows it
        steps_done = summary["rounds"] * args.sync_every
        import_deepmarket("progress").report(summary["rounds"], force=True, steps=steps_done,
                                             total=rounds * args.sync_every, eval_loss=test_loss,
                                             eval_accuracy=test_acc, eval_at=steps_done)
    except ImportError:
        pass
    model.save(os.path.join(args.out, "model.keras"))
    acc = summary["accounts"]
    log("%s accounts: %s" % (tag, ", ".join("rank %s %d accepted %d refused%s" % (
        r, a["accepted"], a["refused"], " (dropped)" if a["dropped"] else "") for r, a in sorted(acc.items()))))
    result = {"test_accuracy": float(test_acc), "test_loss": float(test_loss), "epochs": args.epochs,
              "workers": workers, "mode": "diloco", "held": True, "model": args.model,
              "seconds": round(time.time() - T_START, 3), "fit_seconds": round(time.time() - t_fit, 3),
              "target_accuracy": args.target_accuracy, "target_reached": summary["time_to_target_s"] is not None,
              "sync_every": args.sync_every, "compress": args.compress, "outer_lr": args.outer_lr,
              "outer_momentum": args.outer_momentum, "tensorflow": tf.__version__, "checks": not args.no_checks,
              "verify_rate": args.verify_rate}
    result.update(summary)
    tmp = os.path.join(args.out, "result.json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    os.replace(tmp, os.path.join(args.out, "result.json"))
    return 0


def main(argv=None):
    args = parse_args(argv)
    t_data0 = time.time()
    try:
        (x_train, y_train), (x_test, y_test) = load_data(args.data, args.train_examples)
    except (OSError, EOFError, ValueError) as e:
        print("train.py: error: cannot read the data set: %s" % e, file=sys.stderr)
        return 2
    t_data = time.time() - t_data0
    if args.write_validation:
        x, y = validation_pick(args, x_train, y_train)
        import numpy as np
        with open(args.write_validation, "wb") as f:
            np.savez(f, x=x, y=y)
        log("wrote the validation batch: %d examples to %s" % (len(x), args.write_validation))
        return 0

    t_tf0 = time.time()
    import tensorflow as tf
    # tf_keras (Keras 2), not Keras 3: Keras 3's fit() does not work with
    # MultiWorkerMirroredStrategy across workers (keras-team/keras#20585);
    # tf_keras is what TF's multi-worker Keras tutorial runs on.
    import tf_keras as keras
    t_tf = time.time() - t_tf0
    reporter = progress_reporter(keras)
    eval_callbacks = [reporter] if reporter is not None else []

    cores = os.environ.get("DM_CORES")
    if cores:
        n = max(1, int(float(cores)))
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(n)

    diloco = None
    if args.mode == "diloco":
        try:
            dmt = import_deepmarket()
        except ImportError as e:
            print("train.py: error: --mode diloco needs the deepmarket package (pip install ./python "
                  "from the repository into this environment): %s" % e, file=sys.stderr)
            return 2
        strategy = tf.distribute.get_strategy()  # the default: this worker alone
        try:
            peers = dmt.from_env()
        except ValueError as e:
            print("train.py: error: %s" % e, file=sys.stderr)
            return 2
        holding = peers.holder is not None and peers.rank == peers.holder
        chief, task_id, workers = peers.rank == 0 and peers.holder is None, peers.rank, peers.workers
        task = "holder" if holding else "worker %d" % task_id
        global_batch = args.batch_size * workers  # all workers together, as in sync mode
        local_batch = args.batch_size
    elif cluster_size(os.environ.get("TF_CONFIG")) <= 1:
        # One worker: plain Keras. MultiWorkerMirroredStrategy with a single
        # worker still runs its collectives every step (a third slower on a
        # small machine), which no one training alone would pay for.
        strategy = tf.distribute.get_strategy()
        chief, task_id, task, workers = True, 0, "worker 0", 1
        global_batch = local_batch = args.batch_size
    else:
        strategy = sync_strategy(tf)
        resolver = strategy.cluster_resolver
        chief = is_chief(resolver)
        task_id = resolver.task_id or 0
        task = "%s %d" % (resolver.task_type or "worker", task_id)
        workers = strategy.num_replicas_in_sync
        global_batch = local_batch = args.batch_size * workers
    steps = args.steps_per_epoch or max(1, len(x_train) // global_batch)
    tag = "[%s]" % task
    if args.mode == "diloco" and holding:
        rounds = -(-args.epochs * steps // args.sync_every)
        log("%s start: holding the model of %d diloco workers, %d rounds, checks on %d examples, TF %s "
            "(import %.1fs, data load %.1fs)" % (tag, workers, rounds, args.check_examples, tf.__version__,
                                                  t_tf, t_data))
    elif args.mode == "diloco":
        rounds = -(-args.epochs * steps // args.sync_every)
        diloco = dmt.DiLoCo(sync_every=args.sync_every, compress=None if args.compress == "none" else args.compress,
                            outer_lr=args.outer_lr, outer_momentum=args.outer_momentum, overlap=args.overlap,
                            rounds=rounds, join_timeout=args.join_timeout, timeout=args.round_timeout,
                            checkpoint_dir=args.out, log=lambda m: log("%s %s" % (tag, m)))
        log("%s start: diloco, %d workers, chief=%s, %d train / %d test examples, batch %d per worker, "
            "%d steps/epoch, %d epochs, sync every %d steps (%d rounds), %s%s, TF %s (import %.1fs, data load %.1fs)"
            % (tag, workers, chief, len(x_train), len(x_test), local_batch, steps, args.epochs,
               args.sync_every, rounds, args.compress, ", overlapped" if args.overlap else "",
               tf.__version__, t_tf, t_data))
    else:
        log("%s start: %d replicas in sync, chief=%s, %d train / %d test examples, "
            "global batch %d, %d steps/epoch, %d epochs, TF %s (import %.1fs, data load %.1fs)"
            % (tag, workers, chief,
               len(x_train), len(x_test), global_batch, steps, args.epochs, tf.__version__, t_tf, t_data))

    keras.utils.set_random_seed(args.seed)
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    if cores:
        opts.threading.private_threadpool_size = max(1, int(float(cores)))
    train_ds = (train_batches(tf, x_train, y_train, args.seed + (task_id if diloco else 0), local_batch)
                .with_options(opts)
                .prefetch(tf.data.AUTOTUNE))
    # Larger batches for evaluation: fewer steps, so fewer all-reduces.
    test_ds = (tf.data.Dataset.from_tensor_slices((x_test, y_test))
               .batch(max(global_batch, 512 * workers) if diloco is None else 1024)
               .with_options(opts))

    with strategy.scope():
        model = build_model(keras, args.model)
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])

    os.makedirs(args.out, exist_ok=True)
    if args.mode == "diloco" and holding:
        return hold(args, tf, keras, dmt, model, x_train, y_train, test_ds, rounds, steps, workers, tag, local_batch)
    # BackupAndRestore (tf_keras): the chief saves its checkpoint after every
    # epoch in OUT/backup/chief/, other workers write to temporary folders in
    # OUT/backup/; on a restart every worker restores from OUT/backup/chief/.
    # In diloco mode the DiLoCo callback keeps its own checkpoint instead.
    backup_dir = os.path.join(args.out, "backup")
    got_copy = False
    if diloco is None:
        if workers > 1:
            has_ckpt, got_copy = sync_backup_from_chief(tf, strategy, backup_dir, chief, tag)
        else:
            has_ckpt = os.path.isdir(os.path.join(backup_dir, "chief"))
        if has_ckpt and chief:
            log("%s resuming from the checkpoint in %s" % (tag, backup_dir))

    class Progress(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs_run = 0
            self.steps_run = 0
            self.first_step_at = None
            self.train_seconds = 0.0
            self.t_epoch = None

        def on_epoch_begin(self, epoch, logs=None):
            self.t_epoch = time.time()
            self.epoch_steps = 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps_run += 1
            self.epoch_steps += 1
            if self.first_step_at is None:
                self.first_step_at = time.time() - T_START
                log("%s first step done %.1fs after process start" % (tag, self.first_step_at))

        def on_epoch_end(self, epoch, logs=None):
            dt = time.time() - self.t_epoch
            self.t_epoch = None
            self.epochs_run += 1
            self.train_seconds += dt
            logs = logs or {}
            extra = " round %d" % logs["diloco_round"] if "diloco_round" in logs else ""
            log("%s epoch %d/%d: loss %.4f accuracy %.4f, %.1fs, %.0f examples/s%s"
                % (tag, epoch + 1, args.epochs, logs.get("loss", float("nan")),
                   logs.get("accuracy", float("nan")), dt, self.epoch_steps * local_batch / dt, extra))

        def on_train_end(self, logs=None):
            if self.t_epoch is not None:  # stopped in the middle of an epoch
                self.train_seconds += time.time() - self.t_epoch

    class Target(keras.callbacks.Callback):
        """Evaluates the test set every --eval-every steps (else every epoch)
        and stops training at --target-accuracy. sync: every worker evaluates
        (the evaluation is itself distributed) and all stop together. diloco:
        the chief evaluates the global weights right after a round and asks
        the job to stop; the others stop at that round's end."""

        def __init__(self):
            super().__init__()
            self.history = []
            self.reached_at = None
            self.eval_seconds = 0.0
            self.since = 0
            self.due = False

        def on_train_batch_end(self, batch, logs=None):
            self.since += 1
            if args.eval_every and self.since >= args.eval_every:
                self.due = True
            if self.due and (diloco is None or diloco.synced) and not self.model.stop_training:
                self.check()

        def on_epoch_end(self, epoch, logs=None):
            if not args.eval_every:
                self.due = True
                if diloco is None or diloco.synced:
                    self.check()

        def check(self):
            self.due, self.since = False, 0
            if diloco is not None and not chief:
                return
            t0 = time.time()
            if diloco is not None:
                with diloco.global_weights():  # the job's weights, not this worker's own steps since
                    loss, acc = self.model.evaluate(test_ds, verbose=0, callbacks=eval_callbacks)
            else:
                loss, acc = self.model.evaluate(test_ds, verbose=0, callbacks=eval_callbacks)
            took = time.time() - t0
            self.eval_seconds += took
            at = time.time() - T_START
            self.history.append([round(at, 3), progress.steps_run, round(float(acc), 4)])
            log("%s eval after %d steps, %.1fs: test accuracy %.4f (%.1fs)"
                % (tag, progress.steps_run, at, acc, took))
            if acc >= args.target_accuracy and self.reached_at is None:
                self.reached_at = at
                log("%s reached the target accuracy %.4f after %.1fs" % (tag, args.target_accuracy, at))
                if diloco is not None:
                    diloco.request_stop()
                else:
                    self.model.stop_training = True
            elif diloco is not None:
                # The others kept training meanwhile: skip the steps we missed
                # rather than have them wait for us at the round's end.
                diloco.catch_up(took)

    class WarmUp(keras.callbacks.Callback):
        """Sync mode, k workers: the learning rate scaled to the global batch
        (--lr-scale), reached linearly over --warmup-steps (Goyal et al. 2017)."""

        def __init__(self, base, peak, steps):
            super().__init__()
            self.base, self.peak, self.steps, self.done = base, peak, steps, False

        def on_train_batch_begin(self, batch, logs=None):
            if self.done:
                return
            it = int(self.model.optimizer.iterations.numpy())
            frac = 1.0 if self.steps == 0 else min(1.0, (it + 1) / self.steps)
            self.model.optimizer.learning_rate.assign(self.base + (self.peak - self.base) * frac)
            self.done = frac >= 1.0

    progress = Progress()
    target = Target()
    if diloco is not None:
        callbacks = [diloco, progress]
    else:
        callbacks = [keras.callbacks.BackupAndRestore(backup_dir=backup_dir), progress]
    if reporter is not None:
        callbacks.append(reporter)
    if args.target_accuracy is not None:
        callbacks.append(target)
    if diloco is None and workers > 1 and args.lr_scale != "none":
        peak = args.learning_rate * (workers if args.lr_scale == "linear" else workers ** 0.5)
        callbacks.insert(0, WarmUp(args.learning_rate, peak, args.warmup_steps))
        log("%s learning rate %g -> %g (%s scaling to the global batch) over %d steps"
            % (tag, args.learning_rate, peak, args.lr_scale, args.warmup_steps))
    t_fit = time.time()
    log("%s fit starts %.1fs after process start" % (tag, t_fit - T_START))
    model.fit(train_ds, epochs=args.epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0)
    fit_seconds = time.time() - t_fit
    log("%s fit done in %.1fs" % (tag, fit_seconds))
    if diloco is None and progress.epochs_run < args.epochs and target.reached_at is None:
        log("%s resumed from backup: ran %d of %d epochs" % (tag, progress.epochs_run, args.epochs))

    if diloco is None:
        # BackupAndRestore deletes the checkpoint after fit on the chief; also drop
        # the copy a non-chief worker got (own OUT only) and the empty folder.
        if got_copy:
            shutil.rmtree(os.path.join(backup_dir, "chief"), ignore_errors=True)
        try:
            os.rmdir(backup_dir)
        except OSError:
            pass

    if diloco is not None and not chief:
        log("%s done: the chief evaluates and saves the model" % tag)
        return 0

    t_eval = time.time()
    log("%s evaluating the model on %d test examples..." % (tag, len(x_test)))
    test_loss, test_acc = model.evaluate(test_ds, verbose=0, callbacks=eval_callbacks)
    log("%s test: loss %.4f accuracy %.4f (%.1fs)" % (tag, test_loss, test_acc, time.time() - t_eval))

    # Every worker saves (saving may involve collective ops); only the chief
    # keeps its copy, the others write to a temporary folder and delete it.
    t_save = time.time()
    save_dir = args.out if chief else tempfile.mkdtemp(prefix="dm-worker%d-" % task_id)
    try:
        model.save(os.path.join(save_dir, "model.keras"))
    finally:
        if not chief:
            shutil.rmtree(save_dir, ignore_errors=True)
    log("%s model saved (%.1fs)" % (tag, time.time() - t_save))

    if chief:
        seconds = time.time() - T_START
        examples = progress.steps_run * global_batch
        train_s = fit_seconds - target.eval_seconds
        result = {
            "test_accuracy": float(test_acc),
            "test_loss": float(test_loss),
            "epochs": args.epochs,
            "workers": workers,
            "seconds": round(seconds, 3),
            "examples_per_second": round(examples / progress.train_seconds, 1) if progress.train_seconds else 0.0,
            "epochs_run": progress.epochs_run,
            "steps_per_epoch": steps,
            "global_batch_size": global_batch,
            "train_examples": int(len(x_train)),
            "first_step_seconds": round(progress.first_step_at, 3) if progress.first_step_at else None,
            "tf_import_seconds": round(t_tf, 3),
            "model": args.model,
            "tensorflow": tf.__version__,
            "mode": args.mode,
            "target_accuracy": args.target_accuracy,
            "target_reached": target.reached_at is not None,
            "time_to_target_s": round(target.reached_at, 3) if target.reached_at is not None else None,
            "evals": target.history,
            "eval_seconds": round(target.eval_seconds, 3),
            "fit_seconds": round(fit_seconds, 3),
        }
        if diloco is not None:
            st = diloco.stats
            # Examples of every worker: the rounds' inner steps, summed by the coordinator.
            examples = diloco.averager.steps_total * local_batch
            result.update({
                "examples_per_second": round(examples / progress.train_seconds, 1) if progress.train_seconds else 0.0,
                "bytes_sent": st["bytes_sent"],
                "bytes_received": st["bytes_received"],
                "bytes_sent_per_round": st["bytes_sent_per_round"],
                "rounds": diloco.round,
                "sync_every": args.sync_every,
                "compress": args.compress,
                "outer_lr": args.outer_lr,
                "outer_momentum": args.outer_momentum,
                "overlap": args.overlap,
                "diloco": st,
            })
        else:
            # MultiWorkerMirroredStrategy's ring all-reduce sends about
            # 2(W-1)/W of the gradients (float32) a step from every worker.
            grad_bytes = 4 * model.count_params()
            result.update({
                "bytes_sent": int(progress.steps_run * 2 * (workers - 1) / workers * grad_bytes),
                "bytes_sent_estimated": True,
                "rounds": progress.steps_run,
            })
        result["examples_per_s"] = round(examples / train_s, 1) if train_s > 0 else 0.0
        tmp = os.path.join(args.out, "result.json.tmp")
        with open(tmp, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        os.replace(tmp, os.path.join(args.out, "result.json"))
        log("%s wrote %s and %s (%.1fs total)" % (tag, os.path.join(args.out, "model.keras"),
                                               os.path.join(args.out, "result.json"), seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
