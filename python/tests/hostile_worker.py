"""A hostile DiLoCo worker for the held-mode tests: runs the example's
train.py with its averaging pushes changed as DM_HOSTILE says.

  scaled  the update times 1000
  random  random normal values in place of the update
  nan     the update with NaN values (sent past the codec, which refuses them)
  empty   an update of zeros: trains, but hands in nothing
  shirk   a third of its update: the size of the work of fewer steps than
          it says it took (held mode's checks accept it; spot checks do not)
  lazy    runs nothing at all (a lender that reports its worker running)

Usage: hostile_worker.py TRAIN_PY [train.py's arguments...]
"""

import os
import runpy
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np

from deepmarket.train import averager


def main():
    how = os.environ.get("DM_HOSTILE", "")
    if how == "lazy":
        time.sleep(3600)
        return 0
    push = averager.Averager._push
    rng = np.random.default_rng(7)

    def hostile_push(self, c, delta, steps, stop):
        if delta is None or how not in ("scaled", "random", "nan", "empty", "shirk"):
            return push(self, c, delta, steps, stop)
        if how == "scaled":
            return push(self, c, delta * np.float32(1000), steps, stop)
        if how == "random":
            return push(self, c, rng.standard_normal(delta.size).astype(np.float32), steps, stop)
        if how == "shirk":
            return push(self, c, delta * np.float32(0.3), steps, stop)
        if how == "empty":
            return push(self, c, np.zeros_like(delta), steps, stop)
        bad = np.array(delta, dtype="<f4")
        bad[::7] = np.nan
        h = {"t": "push", "steps": steps, "stop": bool(stop), "codec": "none", "n": int(bad.size)}
        return self._request(c, h, bad.tobytes(), reuse=True)

    averager.Averager._push = hostile_push
    train = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(train, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
