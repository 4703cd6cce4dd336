// Package units parses and formats the quantities people type and read:
// sizes ("8GiB", "8G", "8192MiB") and credit amounts ("1.5" credits, kept as
// integer micro-credits). It is a leaf: anything may import it.
package units
