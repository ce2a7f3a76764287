package sockdiag

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitCount polls Orphans until it reports want for dst, or fails.
func waitCount(t *testing.T, dst netip.AddrPort, want int, what string) {
	t.Helper()
	var got int
	var err error
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if got, err = Orphans([]netip.AddrPort{dst}); err == nil && got == want {
			return
		}
	}
	t.Fatalf("%s: Orphans(%v) = %d, %v; want %d", what, dst, got, err, want)
}

// TestOrphansCountsClosedConnectionsTheServerHolds: a connection this
// process closed while the server holds it open is counted until the server
// closes it; one this process holds half-closed is not, nor one to another
// address.
func TestOrphansCountsClosedConnectionsTheServerHolds(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			host := "127.0.0.1:0"
			if network == "tcp6" {
				host = "[::1]:0"
			}
			ln, err := net.Listen(network, host)
			if err != nil {
				t.Fatalf("listen %s: %v", network, err)
			}
			defer ln.Close()
			other, err := net.Listen(network, host)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			dst := ln.Addr().(*net.TCPAddr).AddrPort()
			otherDst := other.Addr().(*net.TCPAddr).AddrPort()

			held := make(chan net.Conn, 4)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					held <- c
				}
			}()
			go func() {
				for {
					c, err := other.Accept()
					if err != nil {
						return
					}
					defer c.Close()
				}
			}()
			waitCount(t, dst, 0, "before any connection")

			closed, err := net.Dial(network, dst.String())
			if err != nil {
				t.Fatal(err)
			}
			half, err := net.Dial(network, dst.String())
			if err != nil {
				t.Fatal(err)
			}
			defer half.Close()
			toOther, err := net.Dial(network, otherDst.String())
			if err != nil {
				t.Fatal(err)
			}
			srv1, srv2 := <-held, <-held
			defer srv1.Close()
			defer srv2.Close()

			closedLocal := closed.LocalAddr().(*net.TCPAddr).AddrPort()
			halfLocal := half.LocalAddr().(*net.TCPAddr).AddrPort()
			closed.Close()
			half.(*net.TCPConn).CloseWrite()
			toOther.Close()
			waitCount(t, dst, 1, "one closed, one half-closed and held")
			for _, c := range []struct {
				local netip.AddrPort
				want  int
			}{{closedLocal, 1}, {halfLocal, 0}} {
				if n, err := OrphansOf([]Conn{{Local: c.local, Remote: dst}}); n != c.want || err != nil {
					t.Errorf("OrphansOf the connection from %v = %d, %v; want %d", c.local, n, err, c.want)
				}
			}

			// The server lets go of both: the orphan is done.
			srv1.Close()
			srv2.Close()
			waitCount(t, dst, 0, "after the server closed")
		})
	}
}

// to names the connections to dsts from any local end.
func to(dsts ...netip.AddrPort) []Conn {
	conns := make([]Conn, len(dsts))
	for i, d := range dsts {
		conns[i].Remote = d
	}
	return conns
}

// TestParseRejectsMalformedReplies: a reply whose messages do not fit it is
// an error; an error message is the kernel's errno; a reply to another
// request is not counted.
func TestParseRejectsMalformedReplies(t *testing.T) {
	dst := netip.MustParseAddrPort("127.0.0.1:8080")
	sock := func(seq uint32) []byte {
		b := make([]byte, nlmsgHdrLen+diagMsgLen)
		ne := binary.NativeEndian
		ne.PutUint32(b[0:], uint32(len(b)))
		ne.PutUint16(b[4:], unix.SOCK_DIAG_BY_FAMILY)
		ne.PutUint32(b[8:], seq)
		m := b[nlmsgHdrLen:]
		m[0] = unix.AF_INET
		m[msgState] = tcpFinWait2
		binary.BigEndian.PutUint16(m[msgDport:], 8080)
		copy(m[msgDst:], []byte{127, 0, 0, 1})
		ne.PutUint32(m[msgUID:], 1000)
		return b
	}
	done := func(seq uint32) []byte {
		b := make([]byte, nlmsgHdrLen+4)
		binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
		binary.NativeEndian.PutUint16(b[4:], unix.NLMSG_DONE)
		binary.NativeEndian.PutUint32(b[8:], seq)
		return b
	}
	reply := append(append(sock(7), sock(6)...), done(7)...)
	n, fin, err := parse(reply, 7, unix.AF_INET, 1000, to(dst))
	if err != nil || n != 1 || !fin {
		t.Fatalf("parse of one match, one stale, done: %d, %v, %v; want 1, true, nil", n, fin, err)
	}
	if n, _, _ := parse(sock(7), 7, unix.AF_INET, 1001, to(dst)); n != 0 {
		t.Fatalf("another user's socket counted")
	}
	for name, b := range map[string][]byte{
		"short header":    sock(7)[:10],
		"length past end": sock(7)[:nlmsgHdrLen+20],
		"short message":   func() []byte { b := sock(7)[:nlmsgHdrLen+20]; binary.NativeEndian.PutUint32(b, 36); return b }(),
		"length under header": func() []byte {
			b := sock(7)
			binary.NativeEndian.PutUint32(b, 8)
			return b
		}(),
	} {
		if _, _, err := parse(b, 7, unix.AF_INET, 1000, to(dst)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	e := make([]byte, nlmsgHdrLen+4)
	binary.NativeEndian.PutUint32(e[0:], uint32(len(e)))
	binary.NativeEndian.PutUint16(e[4:], unix.NLMSG_ERROR)
	binary.NativeEndian.PutUint32(e[8:], 7)
	errno := -int32(unix.EPERM)
	binary.NativeEndian.PutUint32(e[nlmsgHdrLen:], uint32(errno))
	if _, _, err := parse(e, 7, unix.AF_INET, 1000, nil); err == nil || err.Error() != "sock_diag: "+unix.EPERM.Error() {
		t.Fatalf("error message: %v, want EPERM", err)
	}
}

// FuzzParse: no reply, however malformed, panics the parser or counts more
// sockets than it has messages.
func FuzzParse(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, nlmsgHdrLen+diagMsgLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		conns := append(to(netip.MustParseAddrPort("127.0.0.1:0"), netip.MustParseAddrPort("[::1]:0")),
			Conn{Local: netip.MustParseAddrPort("127.0.0.1:0"), Remote: netip.MustParseAddrPort("127.0.0.1:0")})
		for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
			n, _, _ := parse(b, 0, fam, 0, conns)
			if n > len(b)/(nlmsgHdrLen+diagMsgLen) {
				t.Fatalf("%d sockets counted in %d bytes", n, len(b))
			}
		}
	})
}
