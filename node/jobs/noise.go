package jobs

import (
	"regexp"
	"strings"
)

// noise matches the lines TensorFlow and its libraries write on every
// start and that tell a researcher nothing about the job: C++ log lines
// (timestamped "I tensorflow/...", absl's "I0000 00:00:..."), Python's
// "WARNING:tensorflow:" and "WARNING:absl:" lines, oneDNN's and the CPU
// instructions' notices, and CUDA's probing on machines without a GPU.
// Errors from the job's own code (tracebacks, its own prints) never match.
var noise = regexp.MustCompile(`^(` +
	`\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] (tensorflow|external)/` + // TF's C++ logging
	`|[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] ` + // absl / gRPC
	`|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR` +
	`|(WARNING|INFO):(tensorflow|absl):` +
	`|To enable the following instructions: ` +
	`|oneDNN custom operations are on` +
	`|Could not find cuda drivers` +
	`)`)

// NoiseTags are the prefixes a job's log puts before a worker's lines.
var noiseTag = regexp.MustCompile(`^\[(w\d+|h)\] `)

// IsNoise says whether a line of a job's log is TensorFlow's start-up
// noise (after the log's worker tag), hidden unless asked for.
func IsNoise(line string) bool {
	line = noiseTag.ReplaceAllString(strings.TrimRight(line, "\r\n"), "")
	return noise.MatchString(line)
}
