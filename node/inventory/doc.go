// Package inventory detects what a lab machine has to lend: cores, memory,
// GPUs (through nvidia-smi), free disk, and the Python and TensorFlow found
// on it. It runs probes only; it decides nothing.
package inventory
