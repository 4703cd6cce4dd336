package jobs

import "testing"

// TensorFlow's start-up lines are noise; the job's own output, its
// errors and the node's lines are not.
func TestIsNoise(t *testing.T) {
	for _, l := range []string{
		"[w0] 2026-11-27 00:53:30.272382: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on.",
		"[w1] 2026-11-27 00:53:31.001: W tensorflow/compiler/xla/stream_executor/cuda/cuda_driver.cc:268] failed call to cuInit",
		"[w0] I0000 00:00:1732667610.123456   12345 grpc_server_lib.cc:469] Started server with target: grpc://localhost:23000",
		"[h] WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
		"[w0] WARNING:tensorflow:Collective ops is not configured at program startup. Some performance features may not be enabled.",
		"[w1] INFO:tensorflow:Enabled multi-worker collective ops with available devices",
		"[w0] To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.",
		"WARNING:absl:You are saving your model as an HDF5 file",
	} {
		if !IsNoise(l) {
			t.Errorf("not noise: %q", l)
		}
	}
	for _, l := range []string{
		"[w0] [train 12:00:01] worker 0 start: 2 replicas in sync",
		"[w0] Traceback (most recent call last):",
		"[w0] tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor",
		"[deepmarket 12:00:00] run ends: the chief finished",
		"[w0] WARNING: my own warning about tensorflow",
		"",
	} {
		if IsNoise(l) {
			t.Errorf("noise: %q", l)
		}
	}
}
