"""Synchronous data-parallel training across a job's workers, patient with
machines that stall.

tf.distribute.MultiWorkerMirroredStrategy starts TensorFlow's coordination
service with its defaults: every worker sends the leader a heartbeat every
5 s, each RPC given 5 s, and the leader declares a worker dead after 10 s
without one. One missed heartbeat aborts every worker's collectives ("The
following tasks are unhealthy (stopped sending heartbeats)"), and the job
fails. On a lab machine that is a matter of seconds: the owner comes back
and the node freezes the job's workers (the owner policy's suspend), the
machine is briefly overloaded, the link between two campuses stalls.

The node already watches every worker (it polls each machine every second
and re-places a job whose machine is lost, from its checkpoint), and a
worker that exits breaks its peers' connections at once, so the
coordination service need not judge a worker by its heartbeats. strategy()
configures it to wait HEARTBEAT_TIMEOUT, long enough for a suspension to
resume or be vacated by the node, before the strategy starts it.
"""

import json
import os

# HEARTBEAT_TIMEOUT is how long, in seconds, the leader waits for a worker's
# heartbeat; each heartbeat RPC may take half of it. Twenty-five minutes: a
# stalled worker is the node's to judge, and its owner policy vacates a
# suspension after 10 minutes (vacate_after) by default.
HEARTBEAT_TIMEOUT = 25 * 60


def strategy(heartbeat_timeout=HEARTBEAT_TIMEOUT):
    """A MultiWorkerMirroredStrategy over TF_CONFIG's cluster, its workers'
    heartbeats allowed heartbeat_timeout seconds. Call it before TensorFlow
    runs anything, as the strategy itself must be."""
    import tensorflow as tf

    configure_coordination(heartbeat_timeout)
    return tf.distribute.MultiWorkerMirroredStrategy()


def configure_coordination(heartbeat_timeout, tf_config=None):
    """Configures TensorFlow's coordination service for TF_CONFIG's
    cluster as MultiWorkerMirroredStrategy would (the same leader, the same
    jobs), with heartbeat_timeout seconds for heartbeats. The strategy
    keeps a service configured before it. Returns whether it configured
    one: not without a cluster of two or more tasks, nor when one is
    configured already."""
    # The protobuf module the strategy itself uses: it moved between
    # TensorFlow releases.
    from tensorflow.python.distribute.collective_all_reduce_strategy import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context
    from tensorflow.python.training import server_lib

    if heartbeat_timeout <= 0:
        raise ValueError("heartbeat_timeout must be positive, not %r" % (heartbeat_timeout,))
    cfg = json.loads(tf_config if tf_config is not None else os.environ.get("TF_CONFIG") or "{}")
    cluster = cfg.get("cluster") or {}
    if sum(len(v) for v in cluster.values()) < 2 or context.context().coordination_service is not None:
        return False
    spec = server_lib.ClusterSpec(cluster)
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
            for job in ("chief", "worker") if job in spec.jobs]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        heartbeat_timeout_in_ms=int(heartbeat_timeout * 1000),
        coordinated_jobs=jobs,
    )
    return True
