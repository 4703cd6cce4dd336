//go:build !linux

package storage

const oDirect = 0
