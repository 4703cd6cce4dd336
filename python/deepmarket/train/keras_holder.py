"""The model's holder for a Keras model (held mode, see holder.py).

The job's submitter runs its own training program with DM_ROLE=holder: the
program builds its model as the workers do and hands it to KerasHolder
instead of calling fit. The holder then keeps the global weights, checks
every worker's update on a validation batch of the submitter's own data,
evaluates the model now and then, asks the workers to stop at the target,
and ends with the model in `model` (the job's result is the submitter's own
copy, not a lender's).
"""

import os
import threading
import time

import numpy as np

from .. import progress
from . import env as envmod
from .evidence import model_description, model_digest
from .holder import Holder, validation_batch
from .keras_callback import _flatten, _keras, _unflatten, load_optimizer_state


class KerasHolder:
    """KerasHolder(model, x_val, y_val, rounds=R, ...).run() holds the job.

    model: compiled like the workers' (same weights, same order). x_val,
    y_val: the validation batch every update is checked on (a few hundred
    examples keep a check to tens of milliseconds); when the job's bid
    names one by content address ([training] validation, an .npz of x and
    y), that one is used instead, so a referee can check on the same. rounds: the rounds the
    workers run (they stop there). evaluate(model) -> (loss, accuracy),
    called every eval_every rounds on the global weights; target (None):
    stop every worker once accuracy reaches it. sync_every, compress,
    outer_lr, outer_momentum as the workers' DiLoCo; checks (True),
    tolerance (0.1), drop_after (3) as Holder; timeout (60 s): how long a
    round waits for a silent worker; join_timeout (300 s): how long the first
    round waits for the workers to start. out_dir ($DM_OUTPUT_DIR): where
    holder.json (the accounts, rewritten every round) and the checkpoint go.

    Spot checks: verify_rate ($DM_VERIFY_RATE, else 0: none), verify_share
    ($DM_VERIFY_SHARE, else 0.2) and verify_tolerance ($DM_VERIFY_TOLERANCE,
    else 0.1) as Holder's; they need batches(rank, cursor, steps): the
    batches (x, y) worker `rank` trained on from its cursor-th on, as its
    own input pipeline gives them (same seed, same order). A checked round
    is replayed on a copy of the model with a copy of its optimizer.
    """

    def __init__(self, model, x_val, y_val, rounds, evaluate=None, eval_every=1, target=None, sync_every=None,
                 compress=None, outer_lr=0.7, outer_momentum=0.9, checks=True, tolerance=None, drop_after=3,
                 timeout=60.0, join_timeout=300.0, out_dir=None, log=None, batches=None, verify_rate=None,
                 verify_share=None, verify_tolerance=None):
        import tensorflow as tf

        self.model, self.rounds, self.evaluate = model, int(rounds), evaluate
        self.eval_every, self.target = max(1, int(eval_every)), target
        self.out_dir = out_dir if out_dir is not None else os.environ.get("DM_OUTPUT_DIR")
        self._log = log or (lambda m: print("[holder] %s" % m, flush=True))
        if sync_every is None:
            sync_every = int(os.environ.get("DM_SYNC_EVERY") or 500)
        if compress is None:
            compress = os.environ.get("DM_COMPRESS") or "int8"
        self.peers = envmod.from_env()
        if self.peers.holder is None or self.peers.rank != self.peers.holder:
            raise ValueError("KerasHolder runs as the holder (DM_ROLE=holder with DM_AVG_HOLDER set)")
        weights = model.get_weights()
        self._shapes = [w.shape for w in weights]
        self._dtypes = [w.dtype for w in weights]
        trainable = {id(v) for v in model.trainable_weights}
        self._mask = np.concatenate([np.full(int(np.prod(v.shape)), id(v) in trainable, dtype=bool)
                                     for v in model.weights])
        named = validation_batch()
        if named is not None:  # the bid's batch, by its content address
            if "x" not in named or "y" not in named:
                raise ValueError("the validation batch %s has arrays %s: want x and y"
                                 % (os.environ.get("DM_VALIDATION_CID"), sorted(named)))
            if x_val is not None:
                self._log("checking on the bid's validation batch %s (%d examples), not the one given"
                          % (os.environ.get("DM_VALIDATION_CID"), len(named["x"])))
            x_val, y_val = named["x"], named["y"]
        elif x_val is None or y_val is None:
            raise ValueError("no validation batch: give x_val and y_val, or name one in the job's [training] validation")
        self.validation = os.environ.get("DM_VALIDATION_CID")  # None: the program's own, not addressed
        xv, yv = tf.constant(x_val), tf.constant(y_val)
        loss_fn = model.loss if callable(model.loss) else tf.keras.losses.get(model.loss)

        @tf.function
        def val_loss():
            return tf.reduce_mean(loss_fn(yv, model(xv, training=False)))

        def check(theta):
            self._set(theta)
            return float(val_loss())

        if verify_rate is None:
            verify_rate = float(os.environ.get("DM_VERIFY_RATE") or 0)
        if verify_share is None:
            verify_share = float(os.environ.get("DM_VERIFY_SHARE") or 0.2)
        if verify_tolerance is None:
            verify_tolerance = float(os.environ.get("DM_VERIFY_TOLERANCE") or 0.1)
        if verify_rate > 0 and batches is None:
            raise ValueError("spot checks need batches(rank, cursor, steps): the batches a worker trained on")
        self.batches = batches
        self._replay_lock = threading.Lock()
        self._replica = None
        self.holder = Holder(self.peers, sync_every, check=check, checks=checks, tolerance=tolerance,
                             verify_rate=verify_rate, verify_share=verify_share, verify_tolerance=verify_tolerance,
                             replay=self._replay if verify_rate > 0 else None,
                             drop_after=drop_after, compress=compress, outer_lr=outer_lr,
                             outer_momentum=outer_momentum, timeout=timeout, join_timeout=join_timeout,
                             checkpoint_dir=self.out_dir, job=os.environ.get("DM_JOB_ID", ""), log=self._log)
        try:  # what a referee rebuilds the model from, by the digest the answers name
            self.holder.model_digest = model_digest(model_description(model))
        except (TypeError, ValueError, NotImplementedError) as e:
            self._log("the model cannot be described for referees (%s): they will not judge its refusals" % e)
        self.history = []        # (seconds since run, round, accuracy)
        self.reached_at = None   # seconds since run when the target was reached
        self.round_seconds = []  # how long each round took on the holder, start to close

    def run(self):
        """Holds the job until the workers' last round, or every worker is
        gone; returns a summary (rounds, evaluations, accounts). The model
        then holds the final global weights."""
        t0 = time.monotonic()
        self.holder.start(_flatten(self.model.get_weights()), self._mask)
        self._log("holding the model for %d workers: %d rounds of %d steps, checks %s"
                  % (self.peers.workers, self.rounds, self.holder.H, "on" if self.holder.checks else "off"))
        stopping = False
        H = self.holder.H
        evaluation = {}
        progress.report(0, force=True, steps=0, total=self.rounds * H)
        while True:
            t = time.monotonic()
            res = self.holder.next_round()
            if res is None:
                self._log("every worker is gone at round %d" % self.holder.round)
                break
            self.round_seconds.append(time.monotonic() - t)
            self._write_accounts()
            # A worker's steps so far and in all: the job's share done.
            progress.report(res.round, steps=res.round * H, total=self.rounds * H, **evaluation)
            if res.stop or res.round >= self.rounds:
                break
            if self.evaluate and not stopping and (res.round % self.eval_every == 0):
                self._set(res.theta)
                loss, acc = self.evaluate(self.model)
                at = time.monotonic() - t0
                self.history.append([round(at, 3), res.round, round(float(acc), 4)])
                self._log("round %d: test accuracy %.4f (loss %.4f)" % (res.round, acc, loss))
                evaluation = {"eval_loss": loss, "eval_accuracy": acc, "eval_at": res.round * H}
                progress.report(res.round, force=True, steps=res.round * H, total=self.rounds * H, **evaluation)
                if self.target is not None and acc >= self.target:
                    self.reached_at = at
                    self._log("reached the target accuracy %.4f at round %d: stopping the workers"
                              % (self.target, res.round))
                    self.holder.request_stop()
                    stopping = True
        self._set(self.holder.theta)
        self.holder.close(finished=True)
        self._write_accounts()
        h = self.holder
        return {"rounds": h.round, "accounts": h.accounts(), "check_seconds": round(h.check_seconds, 3),
                "replay_seconds": round(h.replay_seconds, 3),
                "round_seconds": round(sum(self.round_seconds), 3),
                "round_times": [round(x, 3) for x in self.round_seconds], "evals": self.history,
                "time_to_target_s": round(self.reached_at, 3) if self.reached_at is not None else None,
                "bytes_sent": h.stats["bytes_sent"], "bytes_received": h.stats["bytes_received"]}

    def _write_accounts(self):
        if self.out_dir:
            os.makedirs(self.out_dir, exist_ok=True)
            self.holder.write_accounts(os.path.join(self.out_dir, "holder.json"))

    def _set(self, theta):
        self.model.set_weights(_unflatten(theta, self._shapes, self._dtypes))

    def _replay(self, theta, state, rank, cursor, steps):
        """A worker's round again: steps of its inner optimizer from theta
        and the optimizer state it committed, on its batches from cursor on;
        returns the weights they reach (flat). Runs on the holder's replay
        thread, on a copy of the model."""
        with self._replay_lock:
            if self._replica is None:
                m = _keras.models.clone_model(self.model)
                opt = self.model.optimizer.__class__.from_config(self.model.optimizer.get_config())
                m.compile(optimizer=opt, loss=self.model.loss)
                opt.build(m.trainable_variables)
                self._replica = m
            m = self._replica
            m.set_weights(_unflatten(theta, self._shapes, self._dtypes))
            load_optimizer_state(m.optimizer, state)
            n = 0
            for x, y in self.batches(rank, cursor, steps):
                m.train_on_batch(x, y)
                n += 1
            if n != steps:
                raise ValueError("its data gives %d batches from cursor %d, not %d" % (n, cursor, steps))
            return _flatten(m.get_weights())
