"""Communication-efficient, elastic data-parallel training (DiLoCo).

Each worker trains on its own for `sync_every` steps, then the workers
average their pseudo-gradients (compressed) and apply an outer optimizer:
hundreds of times less traffic than an all-reduce every step, and a worker
can be lost or added mid-job. Enable it in Keras with a callback:

    import deepmarket.train
    model.fit(ds, epochs=E, steps_per_epoch=S,
              callbacks=[deepmarket.train.DiLoCo(sync_every=500, compress="int8")])

Modules: averager (the protocol and the outer optimizer, numpy only), holder
(held mode: the submitter keeps the model and checks every update), codec
(int8/fp16 compression), wire (framing), env (peers from the environment),
keras_callback (DiLoCo), keras_holder (KerasHolder) and sync
(sync_strategy: MultiWorkerMirroredStrategy patient with stalled machines),
which import TensorFlow on first use of their names. Must
not import anything beyond numpy and TensorFlow/Keras.
"""

from .averager import Averager, Sync, digest, outer_step
from .env import Peers, from_env
from .holder import Holder

__all__ = ["DiLoCo", "KerasHolder", "sync_strategy", "Averager", "Holder", "Sync", "Peers", "from_env", "digest", "outer_step"]


def __getattr__(name):
    # DiLoCo pulls in TensorFlow; the rest of the package must not.
    if name == "DiLoCo":
        from .keras_callback import DiLoCo
        return DiLoCo
    if name == "sync_strategy":
        from .sync import strategy
        return strategy
    if name == "KerasHolder":
        from .keras_holder import KerasHolder
        return KerasHolder
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
