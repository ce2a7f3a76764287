package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/sockdiag"
	"github.com/orbitproxy/orbit/orbitpool"
)

// TestParseEarlySkipsWhatItCannotRead: a sibling's file is read line by
// line; a line cut short, with a field too many or too few, or a bad
// number or address is skipped, and the rest is kept, maxEarly at most.
func TestParseEarlySkipsWhatItCannotRead(t *testing.T) {
	at := time.Unix(0, 1796555591940410992)
	good := "1796555591940410992 127.0.0.1:40000 127.0.0.1:8080\n"
	in := good +
		"x 127.0.0.1:40000 127.0.0.1:8080\n" +
		"1 127.0.0.1 127.0.0.1:8080\n" +
		"1 127.0.0.1:1 [::1]:80 extra\n" +
		"1 127.0.0.1:1\n" +
		"1796555591940410992 [::1]:40001 [::1]:8080\n" +
		"1 127.0.0.1:2 127.0.0.1:8080" // no newline: a write cut short
	got := parseEarly([]byte(in))
	if len(got) != 2 {
		t.Fatalf("parsed %d lines, want 2: %+v", len(got), got)
	}
	if got[0].ends.Local != netip.MustParseAddrPort("127.0.0.1:40000") || got[0].ends.Remote != netip.MustParseAddrPort("127.0.0.1:8080") || !got[0].at.Equal(at) {
		t.Errorf("first line read as %+v", got[0])
	}
	if got[1].ends.Remote != netip.MustParseAddrPort("[::1]:8080") {
		t.Errorf("second line read as %+v", got[1])
	}
	if n := len(parseEarly([]byte(strings.Repeat(good, 3*maxEarly)))); n != maxEarly {
		t.Errorf("a file of %d lines gave %d, want at most %d", 3*maxEarly, n, maxEarly)
	}
}

// FuzzParseEarly: no file, however malformed, panics the parser or gives
// more than maxEarly connections or one per line.
func FuzzParseEarly(f *testing.F) {
	f.Add([]byte("1796555591940410992 127.0.0.1:40000 127.0.0.1:8080\n"))
	f.Add([]byte("1 [::1]:1 [::ffff:127.0.0.1]:2\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got := parseEarly(b)
		if len(got) > maxEarly || len(got) > strings.Count(string(b), "\n") {
			t.Fatalf("%d connections from %d bytes, %d lines", len(got), len(b), strings.Count(string(b), "\n"))
		}
		for _, c := range got {
			if !c.ends.Local.IsValid() || !c.ends.Remote.IsValid() {
				t.Fatalf("invalid address kept: %+v", c)
			}
		}
	})
}

// TestReadEarlyReadsRegularFilesOnly: what stands in the socket directory
// under a sibling's file name but is no regular file (a FIFO, whose open or
// read would block the request that checks for a refusal; a symlink, to
// /dev/zero say; a directory) is skipped, and a regular one is read.
func TestReadEarlyReadsRegularFilesOnly(t *testing.T) {
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Hour}, nil)
	key := orbitpool.Key{Hi: 1, Lo: 2}
	name := func(pid int) string {
		return filepath.Join(m.node.sockDir, fmt.Sprintf("%s%d-0-%s", earlyPrefix, pid, key))
	}
	if err := syscall.Mkfifo(name(61), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", name(62)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(name(63), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name(60), []byte("1796555591940410992 127.0.0.1:40000 127.0.0.1:8080\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan []closedConn, 1)
	go func() { done <- m.node.readEarly(key) }()
	select {
	case got := <-done:
		if len(got) != 1 || got[0].ends.Local != netip.MustParseAddrPort("127.0.0.1:40000") {
			t.Fatalf("readEarly = %+v, want the regular file's one connection", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("readEarly blocked on what is not a regular file")
	}
}

// TestEarlyHeldCountsAnotherProcessFile: connections another process of the
// fleet closed early (one killed since, say, whose lane a new process may
// have taken) count while the upstream holds them, from that process's
// file; once their file has not been written for maxRefusedHold, it is
// removed.
func TestEarlyHeldCountsAnotherProcessFile(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			held <- c
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv := <-held
	defer srv.Close()
	ends := sockdiag.Conn{Local: c.LocalAddr().(*net.TCPAddr).AddrPort(), Remote: c.RemoteAddr().(*net.TCPAddr).AddrPort()}
	c.Close() // orphaned while srv holds it

	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Hour}, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	key, kc := adv3EarlyKey(t, m, "http://"+ln.Addr().String()+"/")
	other := filepath.Join(m.node.sockDir, fmt.Sprintf("%s%d-0-%s", earlyPrefix, 1<<22+1, key))
	line := fmt.Sprintf("%d %s %s\n", time.Now().UnixNano(), ends.Local, ends.Remote)
	if err := os.WriteFile(other, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); m.node.earlyHeld(key, kc) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("earlyHeld = %d with another process's connection held upstream, want 1", m.node.earlyHeld(key, kc))
		}
	}
	old := time.Now().Add(-maxRefusedHold - time.Second)
	if err := os.Chtimes(other, old, old); err != nil {
		t.Fatal(err)
	}
	if n := m.node.earlyHeld(key, kc); n != 0 {
		t.Errorf("earlyHeld = %d from a file not written for %v, want 0", n, maxRefusedHold)
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Errorf("a file not written for %v is still there: %v", maxRefusedHold, err)
	}
}
