"""Progress reports: how a worker tells the machine it runs on that it is
working, so that its job pays for progress and not for time.

The lender's node gives each worker a file to write, DM_PROGRESS_FILE (in
the worker's own scratch space). `report(units, loss)` replaces it with a
count of the work done so far (steps, batches, records: any number that
only grows while the job works) and, optionally, the last loss. The node
reads it when the submitter asks how the worker is; the submitter notes
when the count last grew. Once a run's workers report, a worker whose count
stops growing for the job's `stall_after` stops the run, and each worker is
paid only up to the last time its count grew. A worker of such a run that
never reports is paid nothing.

A training program says more, for the people who wait for it: its training
steps out of the total it plans (`steps`, `total`: the job's share done and
its ETA in `deepmarket jobs show`, `submit --wait` and the job page), its
last training accuracy, and its last evaluation (`eval_loss`,
`eval_accuracy`, at step `eval_at`): the job's result and its curves.

Keras jobs add a callback, which reports every training and evaluation
batch (at most once a second), with the steps of fit's epochs and the
accuracy and evaluations Keras logs:

    import deepmarket.progress as progress
    progress.report(0)   # started: the run's workers are now held to it
    model.fit(..., callbacks=[progress.keras_callback(keras)])

Without DM_PROGRESS_FILE (a job started by hand) report() does nothing.
Imports nothing beyond the standard library.
"""

import json
import math
import os
import threading
import time

ENV = "DM_PROGRESS_FILE"
# At most one write a second: the node reads the file every few seconds.
MIN_INTERVAL = 1.0

_last = {"at": 0.0, "units": -1}
# report() is called from the training loop and from an overlapped
# averager's thread (answers()): one writer at a time, each through a file
# of its own, so that neither renames away the other's.
_lock = threading.Lock()
# The round answers a held job's worker got so far (answers()): reported
# beside its progress, so that its own node sees them.
_answers = {}


def _finite(x):
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def report(units, loss=None, path=None, force=False, steps=None, total=None, accuracy=None, eval_loss=None,
           eval_accuracy=None, eval_at=None):
    """Records that `units` of work are done (a count that only grows) and
    the last loss; a training program adds its training steps of the
    total it plans, its last accuracy and its last evaluation's loss and
    accuracy (at step eval_at). Returns whether the file was written."""
    path = path or os.environ.get(ENV)
    if not path:
        return False
    units = int(units)
    if units < 0:
        raise ValueError("progress: units must not be negative, got %d" % units)
    with _lock:
        return _write(path, units, loss, force, steps, total, accuracy, eval_loss, eval_accuracy, eval_at)


def _write(path, units, loss, force, steps, total, accuracy, eval_loss, eval_accuracy, eval_at):
    now = time.monotonic()
    if not force and units > 0 and now - _last["at"] < MIN_INTERVAL:
        return False
    rec = {"units": units}
    for key, v in (("loss", loss), ("accuracy", accuracy), ("eval_loss", eval_loss), ("eval_accuracy", eval_accuracy)):
        v = _finite(v) if v is not None else None
        if v is not None:
            rec[key] = v
    for key, v in (("steps", steps), ("total", total), ("eval_at", eval_at)):
        if v is not None and int(v) >= 0:
            rec[key] = int(v)
    rec.update(_answers)
    tmp = "%s.%d.%d.tmp" % (path, os.getpid(), threading.get_ident())
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, path)
    _last["at"], _last["units"] = now, units
    return True


def answers(accepted, refused, refused_run, path=None):
    """Records the round answers a worker got from whoever averages the
    job's updates (a held job's holder): how many of its updates were
    accepted and refused, and how many of the last were refused in a row.
    The next report carries them, and this one writes them now (with the
    last units reported): its node stops a worker refused round after
    round (the lender's [lend] refused_stop), since only the floor pays
    it. Returns whether the file was written."""
    counts = {"accepted": int(accepted), "refused": int(refused), "refused_run": int(refused_run)}
    if min(counts.values()) < 0:
        raise ValueError("progress: answer counts must not be negative, got %r" % counts)
    with _lock:
        _answers.update(counts)
        units = _last["units"]
    if units < 0:
        return False
    return report(units, path=path, force=True)


def keras_callback(keras):
    """A Keras callback that reports every training and evaluation batch
    (keras: the module the job trains with, tf_keras or keras)."""

    class Progress(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.units = 0
            self.loss = None
            self.accuracy = None
            self.steps = 0          # training steps, the epochs before this fit's first counted
            self.total = None       # fit's epochs x steps per epoch
            self.per_epoch = None
            self.evaluation = {}    # the last evaluation: eval_loss, eval_accuracy, eval_at
            # A batch's logged loss and accuracy are the epoch's running
            # means, except across replicas (MultiWorkerMirroredStrategy),
            # where tf_keras logs figures that are not (loss 1.1 and
            # accuracy 0.998 for an epoch of 0.55 and 0.81): there the
            # epochs' figures only.
            self.batch_figures = True

        def _report(self, force=False):
            report(self.units, self.loss, force=force, steps=self.steps if self.total else None, total=self.total,
                   accuracy=self.accuracy, **self.evaluation)

        def on_train_begin(self, logs=None):
            # Read now: evaluate() inside fit gives the callback its own params.
            p = self.params or {}
            if p.get("steps") and p.get("epochs"):
                self.per_epoch, self.total = int(p["steps"]), int(p["steps"]) * int(p["epochs"])
            strategy = getattr(getattr(self, "model", None), "distribute_strategy", None)
            self.batch_figures = int(getattr(strategy, "num_replicas_in_sync", 1) or 1) <= 1

        def on_epoch_begin(self, epoch, logs=None):
            if self.per_epoch:
                self.steps = max(self.steps, epoch * self.per_epoch)  # a resumed fit starts past 0

        def on_train_batch_end(self, batch, logs=None):
            self.units += 1
            self.steps += 1
            if logs and self.batch_figures:
                self._figures(logs)
            self._report()

        def _figures(self, logs):
            self.loss = _finite(logs.get("loss")) if "loss" in logs else self.loss
            acc = _accuracy(logs)
            self.accuracy = acc if acc is not None else self.accuracy

        def on_epoch_end(self, epoch, logs=None):
            if logs:
                self._figures(logs)
            self._report(force=True)

        def on_test_batch_end(self, batch, logs=None):
            self.units += 1
            self._report()

        def on_train_end(self, logs=None):
            self._report(force=True)

        def on_test_end(self, logs=None):
            if logs:
                ev = {"eval_at": self.steps}
                loss, acc = _finite(logs.get("loss")), _accuracy(logs)
                if loss is not None and loss >= 0:
                    ev["eval_loss"] = loss
                if acc is not None:
                    ev["eval_accuracy"] = acc
                if len(ev) > 1:
                    self.evaluation = ev
            self._report(force=True)

    return Progress()


def _accuracy(logs):
    """The accuracy Keras logged, under whichever name the metric got."""
    for key in ("accuracy", "acc", "sparse_categorical_accuracy", "categorical_accuracy", "binary_accuracy"):
        if key in logs:
            v = _finite(logs[key])
            if v is not None and 0 <= v <= 1:
                return v
    return None
