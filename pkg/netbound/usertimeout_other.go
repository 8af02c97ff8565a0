//go:build !linux

package netbound

import (
	"net"
	"time"
)

// setUserTimeout: TCP_USER_TIMEOUT is Linux's.
func setUserTimeout(*net.TCPConn, time.Duration) error { return nil }
