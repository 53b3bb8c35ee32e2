//go:build unix

package httppark

import (
	"net"
	"syscall"
)

// alive peeks at the socket without blocking: a connection its client
// closed reads as end of file at once; an open one has nothing to read
// (EAGAIN) or the client's next request. A connection whose socket cannot
// be reached counts as alive: the write will tell.
func alive(c net.Conn) bool {
	for {
		if bc, ok := c.(*backConn); ok && len(bc.pending) > 0 {
			return true // the client sent more: it was there
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := true
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		open = n > 0 || err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR
		return true // done, whatever the answer: never wait
	})
	return err == nil && open
}
