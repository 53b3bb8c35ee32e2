//go:build !unix

package httppark

import "net"

// alive cannot peek at sockets here: the write tells.
func alive(net.Conn) bool { return true }
