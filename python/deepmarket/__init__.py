"""DeepMarket's Python side: what a training job imports on a lent machine.

deepmarket.train       communication-efficient, elastic training (DiLoCo)
deepmarket.bench_local runs a job's workers as processes on one machine

Needs numpy; deepmarket.train.DiLoCo needs TensorFlow with tf_keras (or
Keras). Nothing here imports the Go node or talks to it: the node's part is
the environment variables and the tunnels between workers' ports.
"""
