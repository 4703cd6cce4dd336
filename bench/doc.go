// Package bench holds DeepMarket's benchmark programs (one directory per
// `make bench-*` target). Each compares side by side in one run, prints a
// table with ratios to its reference or goal, and writes JSON to
// bench/results/.
package bench
