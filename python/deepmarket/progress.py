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

Keras jobs add a callback, which reports every training and evaluation
batch (at most once a second):

    import deepmarket.progress as progress
    progress.report(0)   # started: the run's workers are now held to it
    model.fit(..., callbacks=[progress.keras_callback(keras)])

Without DM_PROGRESS_FILE (a job started by hand) report() does nothing.
Imports nothing beyond the standard library.
"""

import json
import math
import os
import time

ENV = "DM_PROGRESS_FILE"
# At most one write a second: the node reads the file every few seconds.
MIN_INTERVAL = 1.0

_last = {"at": 0.0, "units": -1}


def report(units, loss=None, path=None, force=False):
    """Records that `units` of work are done (a count that only grows) and
    the last loss. Returns whether the file was written."""
    path = path or os.environ.get(ENV)
    if not path:
        return False
    units = int(units)
    if units < 0:
        raise ValueError("progress: units must not be negative, got %d" % units)
    now = time.monotonic()
    if not force and units > 0 and now - _last["at"] < MIN_INTERVAL:
        return False
    rec = {"units": units}
    if loss is not None and math.isfinite(float(loss)):
        rec["loss"] = float(loss)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, path)
    _last["at"], _last["units"] = now, units
    return True


def keras_callback(keras):
    """A Keras callback that reports every training and evaluation batch
    (keras: the module the job trains with, tf_keras or keras)."""

    class Progress(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.units = 0
            self.loss = None

        def _tick(self, logs):
            self.units += 1
            if logs and "loss" in logs:
                try:
                    self.loss = float(logs["loss"])
                except (TypeError, ValueError):
                    pass
            report(self.units, self.loss)

        def on_train_batch_end(self, batch, logs=None):
            self._tick(logs)

        def on_test_batch_end(self, batch, logs=None):
            self._tick(None)

        def on_train_end(self, logs=None):
            report(self.units, self.loss, force=True)

        def on_test_end(self, logs=None):
            report(self.units, self.loss, force=True)

    return Progress()
