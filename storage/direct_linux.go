package storage

import "syscall"

const oDirect = syscall.O_DIRECT
