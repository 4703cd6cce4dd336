"""A referee's recomputation of a refused round (python -m deepmarket.train.referee).

A worker that appeals a refusal gives referees its evidence (evidence.py):
the round's global weights, its update, the weights before the last update
and the model's description, whose digests the payer's signed answer names,
with the validation batch the job's bid names by content address and the
bid's thresholds. The referee's node checks the answer's signature and
hands this program the digests and thresholds it signed (case.json); this
program, the node's own code and never the job's, judges the update again:

  - the evidence must be what the answer names (each digest), else the
    refusal stands: an appellant cannot bring other arrays;
  - an update that is not finite, or empty, was rightly refused;
  - one that repeats the last global update (cosine above `echo`) too;
  - the model, rebuilt from its description (Keras, no custom objects, no
    Lambda layers), is evaluated on the batch at theta and at theta -
    update, with the loss the description names: a loss worse than
    theta's by more than `tolerance` (relative) was rightly refused;
  - an update leaning on the last global update (cosine above `residual`)
    must lower the loss by the rest of it alone.

Otherwise the refusal is overturned. What it cannot recompute, it does not
pretend to: the norm bounds (they need the other workers' updates of
recent rounds), a duplicate of another worker's update (that update is the
payer's to show) and spot checks (a replay needs the worker's data). It
prints one JSON line: {"overturn": bool, "why": str, ...}. Exit status 0:
judged; 2: it cannot judge (no model description, a model it cannot
rebuild), and the referee's node does not vote.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

from .evidence import digest, load, model_digest


class CannotJudge(Exception):
    """The case cannot be recomputed here: the referee abstains."""


def _cos(a, b):
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(np.dot(a, b)) / (na * nb) if na > 0 and nb > 0 else 0.0


def _forbidden(cfg):
    """The class names in a Keras config that run code of their own."""
    bad = set()
    if isinstance(cfg, dict):
        if cfg.get("class_name") in ("Lambda", "TFOpLambda", "SlicingOpLambda"):
            bad.add(cfg["class_name"])
        if "module" in cfg and isinstance(cfg.get("module"), str) and not cfg["module"].startswith(
                ("keras", "tf_keras", "builtins")):
            bad.add("module %s" % cfg["module"])
        for v in cfg.values():
            bad |= _forbidden(v)
    elif isinstance(cfg, list):
        for v in cfg:
            bad |= _forbidden(v)
    return bad


def rebuild(desc):
    """(model, loss_fn) from a model description (evidence.model_description)."""
    doc = json.loads(desc)
    bad = _forbidden(doc)
    if bad:
        raise CannotJudge("the model's description uses %s, which a referee does not run" % ", ".join(sorted(bad)))
    from .keras_callback import _keras
    try:
        model = _keras.models.model_from_json(json.dumps(doc["keras"]))
        loss = doc["loss"]
        loss_fn = _keras.losses.get(loss) if isinstance(loss, str) else _keras.losses.deserialize(loss)
    except Exception as e:  # a description this Keras cannot read
        raise CannotJudge("the model cannot be rebuilt from its description: %s" % e)
    return model, loss_fn


def judge(case, ev_dir, validation):
    """The verdict on a case: {"overturn", "why", ...}; raises CannotJudge."""
    meta, theta, prev, update, desc = load(ev_dir)
    names = {"theta": theta, "update": update}
    for k, arr in names.items():
        if arr is None:
            return {"overturn": False, "why": "the evidence has no %s" % k}
        if digest(arr) != case.get(k):
            return {"overturn": False, "why": "the evidence's %s is not the one the payer's answer names" % k}
    if case.get("prev"):
        if prev is None or digest(prev) != case["prev"]:
            return {"overturn": False, "why": "the evidence's earlier weights are not the ones the answer names"}
    else:
        prev = None
    if theta.size != update.size or (prev is not None and prev.size != theta.size):
        return {"overturn": False, "why": "the evidence's arrays differ in size"}
    if not np.isfinite(update).all():
        return {"overturn": False, "why": "the update is not finite"}
    n = float(np.linalg.norm(update))
    if n == 0.0:
        return {"overturn": False, "why": "the update is empty"}
    cos = None
    if prev is not None:
        last = prev - theta
        cos = _cos(update, last)
        if cos > float(case["echo"]):
            return {"overturn": False, "why": "the update repeats the last global update (cosine %.3f)" % cos}
    if not case.get("model"):
        raise CannotJudge("the payer's answer names no model description: its loss cannot be recomputed")
    if desc is None or model_digest(desc) != case["model"]:
        return {"overturn": False, "why": "the evidence's model description is not the one the answer names"}
    model, loss_fn = rebuild(desc)
    with np.load(validation, allow_pickle=False) as z:
        if "x" not in z.files or "y" not in z.files:
            raise CannotJudge("the validation batch has arrays %s: want x and y" % sorted(z.files))
        x, y = z["x"], z["y"]
    from .keras_callback import _unflatten
    weights = model.get_weights()
    shapes, dtypes = [w.shape for w in weights], [w.dtype for w in weights]
    if sum(int(np.prod(s)) for s in shapes) != theta.size:
        return {"overturn": False, "why": "the model has %d weights, the evidence %d"
                % (sum(int(np.prod(s)) for s in shapes), theta.size)}

    def loss(t):
        model.set_weights(_unflatten(t, shapes, dtypes))
        import tensorflow as tf
        return float(tf.reduce_mean(loss_fn(tf.constant(y), model(tf.constant(x), training=False))))

    t0 = time.monotonic()
    base, after = loss(theta), loss(theta - update)
    tol = float(case["tolerance"])
    out = {"loss_theta": base, "loss_update": after, "cosine_last": cos, "round": meta.get("round")}
    if not np.isfinite(after) or after > base + tol * abs(base):
        return dict(out, overturn=False, why="validation loss %.4g from %.4g (tolerance %g%%)" % (after, base, 100 * tol))
    if cos is not None and cos > float(case["residual"]):
        last = prev - theta
        rest = update - np.float32(float(np.dot(update, last)) / float(np.dot(last, last))) * last
        rl = loss(theta - rest)
        out["loss_residual"] = rl
        if not rl < base:
            return dict(out, overturn=False, why="it leans on the last global update (cosine %.3f) and the rest "
                                                 "of it does not lower the validation loss" % cos)
    out["seconds"] = round(time.monotonic() - t0, 3)  # the evaluations: what recomputing cost
    return dict(out, overturn=True, why="the update passes the checks a referee can recompute: validation loss "
                                        "%.4g from %.4g (tolerance %g%%)" % (after, base, 100 * tol))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m deepmarket.train.referee",
                                description="Recompute a refused round's checks for an appeal (see the module doc).")
    p.add_argument("--case", required=True, help="case.json: the digests and thresholds the payer's answer signed")
    p.add_argument("--evidence", required=True, help="the appellant's evidence directory (evidence.py)")
    p.add_argument("--validation", required=True, help="the bid's validation batch (.npz of x and y)")
    a = p.parse_args(argv)
    with open(a.case) as f:
        case = json.load(f)
    try:
        out = judge(case, a.evidence, a.validation)
    except CannotJudge as e:
        print(json.dumps({"abstain": True, "why": str(e)}), flush=True)
        return 2
    print(json.dumps(out, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
