package proxy

import (
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv4RemotesDeadDuringHandshakeIsCounted: a worker killed while its
// TLS handshakes to a named upstream wait on a loaded upstream leaves TCP
// connections the upstream accepted and still holds (they count against its
// limit from accept). The address was told the fleet before the connect
// (dialer.dial's seen), so the worker that joins in its place holds the
// dead one's creations past reclaim_hold while the upstream holds them.
// Told only once dial returned, the address was never told, and the units
// went back on the set time.
func TestAdv4RemotesDeadDuringHandshakeIsCounted(t *testing.T) {
	const reclaimHold = 200 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered: a TLS server too busy to handshake
			mu.Unlock()
			accepted.Add(1)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	port := ln.Addr().(*net.TCPAddr).Port
	url := "https://localhost:" + strconv.Itoa(port)

	seg := filepath.Join(t.TempDir(), "seg")
	owner := startChild(t, seg, url, 0, 2)
	owner.send(t, "hang 2 0")
	owner.expect(t, "hung")
	waitFor(t, 5*time.Second, "the upstream to accept the owner's 2 connections", func() bool { return accepted.Load() == 2 })
	time.Sleep(100 * time.Millisecond)
	me := joinInPlaceOf(t, owner, seg, reclaimHold)
	key := mustKey(t, &Transport{}, url)
	heldAtJoin := heldUnits(t, me.pool)
	time.Sleep(reclaimHold + 3*lingerRecheckForTest)
	lingering := me.node.lingering(key)
	held := heldUnits(t, me.pool)

	// Control: with the address known, the kernel does report the dead
	// owner's connections the upstream still holds.
	me.node.publishRemote(key, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)))
	withAddr := me.node.lingering(key)

	t.Logf("held at join %d; past the hold: held %d, lingering %d; with the address published: lingering %d", heldAtJoin, held, lingering, withAddr)
	if withAddr < 2 {
		t.Fatalf("the kernel reports %d lingering connections even with the address, want 2: the test cannot tell", withAddr)
	}
	if lingering < 2 {
		t.Errorf("the dead owner's 2 connections are held by the upstream, but the fleet never learned their address: lingering = %d, want 2", lingering)
	}
	if heldAtJoin == 2 && held < 2 {
		t.Errorf("past reclaim_hold, with the upstream holding the dead owner's 2 connections: %d units held, want 2", held)
	}
}
