"""DiLoCo as a Keras callback (tf_keras, the Keras 2 TensorFlow ships; else Keras 3)."""

import contextlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

try:
    import tf_keras as _keras
except ImportError:  # pragma: no cover - Keras 3 only environments
    import keras as _keras

from . import env as envmod
from .averager import Averager
from .evidence import model_description


_FROM_ENV = object()  # a default taken from the environment the node gives


class DiLoCo(_keras.callbacks.Callback):
    """DiLoCo makes model.fit on each worker a DiLoCo worker.

    Every worker runs the same plain single-worker Keras program with this
    callback. At the start of fit it joins the job (fetching the current
    global weights from its peers if the job is already running, or resuming
    from the checkpoint in checkpoint_dir); every `sync_every` batches it
    hands its pseudo-gradient to the round's coordinator and continues from
    the new global weights. The inner optimizer (the one given to compile())
    keeps its own state on each worker. With one worker it changes nothing
    (no averaging, no outer step) but still checkpoints.

    Arguments (defaults): sync_every ($DM_SYNC_EVERY, which a job spec's
    [training] sync_every sets, else 500) inner steps between averaging
    rounds; compress ($DM_COMPRESS, else "int8"; "fp16", "none" or None)
    for the pseudo-gradients;
    outer_lr (0.7) and outer_momentum (0.9) of the outer SGD with Nesterov
    momentum; overlap (False): keep training while a round's exchange is on
    the wire, and when the new global weights arrive continue from them plus
    the steps taken meanwhile (hides the link's latency; the global weights
    are the same either way); rounds (None) stops fit after this many global
    rounds (a restarted worker stops with the others); rank and peers (None:
    from DM_RANK and DM_AVG_PEERS, see env.py); checkpoint_dir (None:
    $DM_OUTPUT_DIR if set; the coordinator writes diloco-state.npz there
    after its rounds and removes it when training ends, and every worker
    writes its worker-RANK.json accounting); timeout (60 s: how long a
    round waits for a slow or silent worker), join_timeout (120 s),
    connect_timeout (10 s); log (print).

    Spot checks (held mode with $DM_VERIFY_RATE, a job's [verify]): at each
    round's start the worker commits to its inner optimizer's state and its
    data cursor (the batches it has trained on), and sends that state when
    the holder asks to replay the round (holder.py). Overlap is then off: a
    round must start from the global weights to be replayed.

    When fit ends, the model holds the global weights (the same on every
    worker). Each epoch's logs get diloco_round. After fit, `stats` holds
    this worker's rounds, seconds worked, bytes sent and received.
    """

    def __init__(self, sync_every=None, compress=_FROM_ENV, outer_lr=0.7, outer_momentum=0.9, nesterov=True,
                 overlap=False, rounds=None, rank=None, peers=None, checkpoint_dir=None, timeout=60.0,
                 join_timeout=120.0, connect_timeout=10.0, log=None):
        super().__init__()
        if sync_every is None:  # the job spec's [training] sync_every, else 500
            sync_every = int(os.environ.get("DM_SYNC_EVERY") or 500)
        if compress is _FROM_ENV:  # the job spec's [training] compress, else int8
            compress = os.environ.get("DM_COMPRESS") or "int8"
        if compress == "none":
            compress = None
        self.peers = envmod.from_env(rank=rank, addrs=peers)
        if self.peers.holder is not None and self.peers.rank == self.peers.holder:
            raise ValueError("this process is the model's holder (DM_ROLE=holder), which trains nothing: when "
                             "DM_ROLE is holder the program runs deepmarket.train.KerasHolder (or Holder) instead; "
                             "or the job's spec says [training] holder = \"workers\"")
        self.sync_every = int(sync_every)
        self.verify = self.peers.holder is not None and float(os.environ.get("DM_VERIFY_RATE") or 0) > 0
        self.overlap = bool(overlap) and self.peers.world > 1 and not self.verify
        self.rounds = rounds
        self.checkpoint_dir = checkpoint_dir if checkpoint_dir is not None else os.environ.get("DM_OUTPUT_DIR")
        tag = "[diloco %d/%d]" % (self.peers.rank, self.peers.world)
        self._log = log or (lambda msg: print("%s %s" % (tag, msg), flush=True))
        self._opts = dict(sync_every=sync_every, compress=compress, outer_lr=outer_lr,
                          outer_momentum=outer_momentum, nesterov=nesterov, timeout=timeout,
                          join_timeout=join_timeout, connect_timeout=connect_timeout,
                          checkpoint_dir=self.checkpoint_dir, job=os.environ.get("DM_JOB_ID", ""))
        self.averager = None
        self.stats = {}
        self.synced = False  # True right after new global weights arrived (for callbacks after this one)
        self._stop = False
        self._done = 0       # inner steps since this worker's last hand-in
        self._target = self.sync_every
        self._step_s = None
        self._batches = 0    # batches trained on in this fit: the data cursor a spot check replays from
        self._t_batch = time.monotonic()
        self._pool = None
        self._inflight = None  # (future of Averager.sync, the weights handed in)

    @property
    def rank(self):
        return self.peers.rank

    @property
    def world(self):
        return self.peers.world

    @property
    def round(self):
        return self.averager.round if self.averager else 0

    @contextlib.contextmanager
    def global_weights(self):
        """Within it, the model holds the job's global weights (to evaluate
        them: with overlap, the model's own are those plus the steps since)."""
        if self.averager is None:
            yield
            return
        own = self.model.get_weights()
        self._set(self.averager.theta)
        try:
            yield
        finally:
            self.model.set_weights(own)

    def catch_up(self, seconds):
        """Skips the inner steps this worker could have taken in `seconds`
        it spent on something else (an evaluation, say), so that the others
        do not wait for it at the round's end; returns how many. Call it from
        the training loop (a callback after this one). Alone, it does nothing."""
        if self.world == 1 or self.averager is None or not self._step_s or self.model.stop_training:
            return 0
        n = max(0, min(self._target - self._done, int(seconds / self._step_s)))
        self._target -= n
        self.averager.progress = self.sync_every - (self._target - self._done)
        if n and self._done >= self._target:
            self._round_end()
        return n

    def request_stop(self):
        """Ends training on every worker: called from the training loop (a
        callback after this one), it ends this worker's round now with the
        stop flag, and the coordinator tells everyone at that round's end.
        The job ends on the global weights of the moment (the others' steps
        in that last round are dropped)."""
        self._stop = True
        if self.averager is not None and not self.model.stop_training:
            self.averager.request_stop()
            self._round_end(wait=True)

    # ------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs=None):
        weights = self.model.get_weights()
        self._shapes = [w.shape for w in weights]
        self._dtypes = [w.dtype for w in weights]
        trainable = {id(v) for v in self.model.trainable_weights}
        mask = np.concatenate([np.full(int(np.prod(v.shape)), id(v) in trainable, dtype=bool)
                               for v in self.model.weights]) if weights else np.zeros(0, bool)
        self.averager = Averager(self.peers, log=self._log, **self._opts)
        if self.averager.held and self.averager.evidence_dir:
            try:  # kept beside a refused round's arrays, for referees (evidence.py)
                self.averager.model_description = model_description(self.model)
            except (TypeError, ValueError, NotImplementedError) as e:
                self._log("the model cannot be described for referees: %s" % e)
        if self.overlap:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diloco")
        res = self.averager.start(_flatten(weights), mask)
        self._set(res.theta)
        self._after(res)
        if self._target == 0 and not self.model.stop_training:
            self._round_end()

    def on_train_batch_begin(self, batch, logs=None):
        self._t_batch = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        # The inner step's own time (callbacks and rounds left out), for catch_up.
        dt = time.monotonic() - self._t_batch
        self._step_s = dt if self._step_s is None else 0.9 * self._step_s + 0.1 * dt
        self.synced = False
        self._done += 1
        self._batches += 1
        self.averager.progress = self.sync_every - (self._target - self._done)
        if self._inflight is not None and self._inflight[0].done():
            self._land()
        if self._done >= self._target and not self.model.stop_training:
            self._round_end()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self.averager is not None:
            logs["diloco_round"] = self.averager.round

    def on_train_end(self, logs=None):
        if self.averager is None:
            return
        if self._inflight is not None:
            self._land()
        if self._done > 0:
            if self.model.stop_training:  # steps after the last round: not global, drop them
                self._set(self.averager.theta)
            else:
                self._round_end(wait=True)  # the steps since the last round still count
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.averager.close(finished=True)
        st = dict(self.averager.stats)
        st.update(sync_every=self.sync_every, compress=self.averager.codec, overlap=self.overlap,
                  peers_from=self.peers.source)
        st["bytes_sent_per_round"] = round(st["bytes_sent"] / st["rounds"]) if st["rounds"] else 0
        self.stats = st
        self._log("left at round %d: %d rounds (%d coordinated, %d late, %d resyncs) in %.1fs, "
                  "%d bytes sent (%d a round), %d received"
                  % (st["last_round"], st["rounds"], st["rounds_coordinated"], st["late"], st["resyncs"],
                     st["seconds"], st["bytes_sent"], st["bytes_sent_per_round"], st["bytes_received"]))
        if self.checkpoint_dir:
            os.makedirs(self.checkpoint_dir, exist_ok=True)
            path = os.path.join(self.checkpoint_dir, "worker-%d.json" % self.rank)
            with open(path + ".tmp", "w") as f:
                json.dump(st, f, indent=2)
                f.write("\n")
            os.replace(path + ".tmp", path)

    # ------------------------------------------------------------ rounds

    def _round_end(self, wait=False):
        """Hands in this round's steps. Without overlap (or with wait) it
        blocks until the round's global weights are here; with overlap it
        returns at once and _land applies them when they arrive."""
        while True:
            if self._inflight is not None:
                self._land()  # the previous round's answer first
                if self.model.stop_training or (self._done < self._target and not wait):
                    return
            steps = self._done
            local = _flatten(self.model.get_weights()) if steps > 0 else None
            self._done = 0
            if self.overlap and not wait and steps > 0:
                # Provisional: _land sets the real count when the answer comes.
                self._target = self.sync_every
                self._inflight = (self._pool.submit(self.averager.sync, local, steps, self._stop), local)
                return
            res = self.averager.sync(local, steps, stop=self._stop)
            self._set(res.theta)
            self._after(res)
            self.synced = True
            # A round can end with 0 steps left for the next one (a worker that
            # joined at the very end of a round): then hand in again at once.
            if self.model.stop_training or self._target > 0:
                return

    def _land(self):
        """Applies the answer of the exchange in flight (waiting for it):
        the new global weights plus the steps taken since the hand-in."""
        future, sent = self._inflight
        res = future.result()
        self._inflight = None
        steps = self._done
        self._after(res)
        if self.model.stop_training or steps == 0:
            self._set(res.theta)  # the end: exactly the global weights, the steps since dropped
        else:
            self._set(res.theta + (_flatten(self.model.get_weights()) - sent))
            self._done = steps
        self.synced = True

    def _after(self, res):
        self._done = 0
        self._target = res.steps
        if res.stop or (self.rounds is not None and res.round >= self.rounds):
            self.model.stop_training = True
        elif self.verify:
            self.averager.commit_start(optimizer_state(self.model.optimizer), self._batches)

    def _set(self, theta):
        self.model.set_weights(_unflatten(theta, self._shapes, self._dtypes))


_STATE_MAGIC = b"DMOPT1"


def optimizer_state(opt):
    """The optimizer's variables (their values, in order) as bytes."""
    vs = opt.variables() if callable(opt.variables) else opt.variables
    arrays = [np.asarray(v.numpy()) for v in vs]
    head = json.dumps([[a.dtype.str, list(a.shape)] for a in arrays]).encode()
    return b"".join([_STATE_MAGIC, len(head).to_bytes(4, "little"), head] +
                    [np.ascontiguousarray(a).tobytes() for a in arrays])


def load_optimizer_state(opt, state):
    """Sets the optimizer's variables from optimizer_state's bytes. A
    state of fewer variables (an optimizer not built yet: its step count
    alone) sets those, and the others (its slots) to zero, as new."""
    vs = opt.variables() if callable(opt.variables) else opt.variables
    if not state.startswith(_STATE_MAGIC) or len(state) < len(_STATE_MAGIC) + 4:
        raise ValueError("not an optimizer state")
    n = int.from_bytes(state[len(_STATE_MAGIC):len(_STATE_MAGIC) + 4], "little")
    pos = len(_STATE_MAGIC) + 4 + n
    specs = json.loads(state[len(_STATE_MAGIC) + 4:pos])
    for v in vs[len(specs):]:
        v.assign(np.zeros(v.shape, v.dtype.as_numpy_dtype))
    if len(specs) > len(vs):
        raise ValueError("the state has %d optimizer variables, the model's optimizer %d" % (len(specs), len(vs)))
    for (dt, shape), v in zip(specs, vs):
        dt = np.dtype(dt)
        if tuple(shape) != tuple(v.shape) or dt != np.dtype(v.dtype.as_numpy_dtype):
            raise ValueError("optimizer variable %s is %s %s, the state's %s %s" % (v.name, v.dtype.name, v.shape, dt, shape))
        size = int(np.prod(shape)) * dt.itemsize
        if pos + size > len(state):
            raise ValueError("the optimizer state is cut short")
        v.assign(np.frombuffer(state, dtype=dt, count=int(np.prod(shape)), offset=pos).reshape(shape))
        pos += size
    if pos != len(state):
        raise ValueError("the optimizer state has %d bytes too many" % (len(state) - pos))


def _unflatten(theta, shapes, dtypes):
    """The model's weight arrays from a flat vector (what _flatten made)."""
    out, pos = [], 0
    for shape, dtype in zip(shapes, dtypes):
        n = int(np.prod(shape))
        out.append(theta[pos:pos + n].reshape(shape).astype(dtype, copy=False))
        pos += n
    return out


def _flatten(weights):
    if not weights:
        return np.zeros(0, np.float32)
    return np.concatenate([np.asarray(w, dtype=np.float32).ravel() for w in weights])
