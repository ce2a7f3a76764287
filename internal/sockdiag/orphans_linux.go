// Package sockdiag asks the kernel, over NETLINK_SOCK_DIAG, about the host's
// TCP connections that no process holds any more but that the far end has
// not closed.
//
// A process that closes a connection, or dies holding it, leaves the kernel
// with an orphaned socket: it sends the FIN and keeps the socket in
// FIN_WAIT1 or FIN_WAIT2 until the peer closes its side too (or, in
// FIN_WAIT2, until net.ipv4.tcp_fin_timeout passes, 60 s by default). While
// it is there the peer has not closed the connection, so a server that
// limits its connections still counts it. This is the one place the host
// knows that: the process that could have told is gone.
package sockdiag

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Sizes and offsets of the kernel's structures (linux/netlink.h,
// linux/inet_diag.h), which are part of its ABI.
const (
	nlmsgHdrLen  = 16 // struct nlmsghdr
	diagReqLen   = 56 // struct inet_diag_req_v2
	diagMsgLen   = 72 // struct inet_diag_msg
	msgState     = 1
	msgSport     = 4 // big-endian
	msgDport     = 6 // big-endian
	msgSrc       = 8
	msgDst       = 24
	msgUID       = 64
	msgInode     = 68
	tcpFinWait1  = 4
	tcpFinWait2  = 5
	nlmsgAlignTo = 4
)

// lingerStates are the states of a socket whose own end has closed while
// the far end has not: the FIN is unacknowledged, or acknowledged and
// the peer's own FIN not yet come.
const lingerStates = 1<<tcpFinWait1 | 1<<tcpFinWait2

var seq atomic.Uint32

// Conn names TCP connections by their ends: Remote, and Local unless it is
// the zero AddrPort, which stands for any.
type Conn struct {
	Local, Remote netip.AddrPort
}

// Orphans counts the host's TCP sockets of this process's user, connected to
// one of dsts, whose process has closed them or died while the far end has
// not closed its side. A socket a live process still holds (half-closed with
// shutdown, say) is not counted: it is that process's to account for.
func Orphans(dsts []netip.AddrPort) (int, error) {
	conns := make([]Conn, len(dsts))
	for i, d := range dsts {
		conns[i].Remote = d
	}
	return OrphansOf(conns)
}

// OrphansOf is Orphans of the sockets conns name: with a Local end, the one
// connection, which another process's connection to the same far end is
// not.
func OrphansOf(conns []Conn) (int, error) {
	uid := uint32(os.Getuid())
	n := 0
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		if !slices.ContainsFunc(conns, func(c Conn) bool { return c.Remote.Addr().Unmap().Is4() == (family == unix.AF_INET) }) {
			continue
		}
		c, err := dump(family, uid, conns)
		if err != nil {
			return 0, err
		}
		n += c
	}
	return n, nil
}

// dump asks for family's TCP sockets in lingerStates and counts those that
// match.
func dump(family uint8, uid uint32, conns []Conn) (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, fmt.Errorf("sock_diag socket: %w", err)
	}
	defer unix.Close(fd)
	s := seq.Add(1)
	if err := unix.Sendto(fd, request(family, s), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag request: %w", err)
	}
	buf := make([]byte, 32<<10)
	count := 0
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return 0, fmt.Errorf("sock_diag reply: %w", err)
		}
		c, done, err := parse(buf[:n], s, family, uid, conns)
		if err != nil {
			return 0, err
		}
		count += c
		if done {
			return count, nil
		}
	}
}

// request is a dump request for family's TCP sockets in lingerStates.
func request(family uint8, seq uint32) []byte {
	b := make([]byte, nlmsgHdrLen+diagReqLen)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(b[8:], seq)
	r := b[nlmsgHdrLen:]
	r[0] = family
	r[1] = unix.IPPROTO_TCP
	ne.PutUint32(r[4:], lingerStates)
	return b
}

// parse counts the matching sockets in one datagram of the kernel's reply to
// the request numbered seq, and reports whether the reply is over. A
// message that does not fit its datagram is an error, not a guess.
func parse(b []byte, seq uint32, family uint8, uid uint32, conns []Conn) (count int, done bool, err error) {
	ne := binary.NativeEndian
	for len(b) > 0 {
		if len(b) < nlmsgHdrLen {
			return count, false, fmt.Errorf("sock_diag: %d bytes left, short of a message header", len(b))
		}
		l := int(ne.Uint32(b[0:]))
		typ := ne.Uint16(b[4:])
		if l < nlmsgHdrLen || l > len(b) {
			return count, false, fmt.Errorf("sock_diag: message of %d bytes in %d", l, len(b))
		}
		msg := b[nlmsgHdrLen:l]
		if ne.Uint32(b[8:]) == seq {
			switch typ {
			case unix.NLMSG_DONE:
				return count, true, nil
			case unix.NLMSG_ERROR:
				if len(msg) < 4 {
					return count, false, errors.New("sock_diag: short error message")
				}
				if e := int32(ne.Uint32(msg)); e != 0 {
					return count, false, fmt.Errorf("sock_diag: %w", unix.Errno(-e))
				}
			case unix.SOCK_DIAG_BY_FAMILY:
				if len(msg) < diagMsgLen {
					return count, false, fmt.Errorf("sock_diag: socket message of %d bytes", len(msg))
				}
				if matches(msg, family, uid, conns) {
					count++
				}
			}
		}
		// Messages are aligned; the last one of a datagram may not be
		// padded.
		l = (l + nlmsgAlignTo - 1) &^ (nlmsgAlignTo - 1)
		if l >= len(b) {
			break
		}
		b = b[l:]
	}
	return count, false, nil
}

// matches reports whether the socket msg describes is an orphan of uid's,
// in lingerStates, one of conns.
func matches(msg []byte, family uint8, uid uint32, conns []Conn) bool {
	ne := binary.NativeEndian
	if msg[0] != family || ne.Uint32(msg[msgInode:]) != 0 || ne.Uint32(msg[msgUID:]) != uid {
		return false
	}
	if st := msg[msgState]; st != tcpFinWait1 && st != tcpFinWait2 {
		return false
	}
	local := endpoint(msg, family, msgSrc, msgSport)
	remote := endpoint(msg, family, msgDst, msgDport)
	for _, c := range conns {
		if endpointIs(c.Remote, remote) && (c.Local == netip.AddrPort{} || endpointIs(c.Local, local)) {
			return true
		}
	}
	return false
}

// endpoint reads the address at off and the big-endian port at portOff of
// msg, a socket of family.
func endpoint(msg []byte, family uint8, off, portOff int) netip.AddrPort {
	var addr netip.Addr
	if family == unix.AF_INET {
		addr = netip.AddrFrom4([4]byte(msg[off : off+4]))
	} else {
		addr = netip.AddrFrom16([16]byte(msg[off : off+16])).Unmap()
	}
	return netip.AddrPortFrom(addr, binary.BigEndian.Uint16(msg[portOff:]))
}

// endpointIs reports whether a, as the caller knows it, is e, as the kernel
// reports it (IPv4-mapped IPv6 addresses unmapped).
func endpointIs(a, e netip.AddrPort) bool {
	return a.Port() == e.Port() && a.Addr().Unmap() == e.Addr()
}
