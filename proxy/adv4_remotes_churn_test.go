package proxy

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
)

// TestAdv4RemotesOncePerAddressBeyondMaxRemotes: a process tells the fleet
// an address the first time it learns it, so the dial path does file I/O
// once per new address. A named upstream with more than maxRemotes (8)
// addresses, dialed in turn (DNS round robin), evicts each from
// keyCap.remotes before it comes round again; it was then told again at
// every dial, an open, write and close per dial, and the file grew without
// bound for the fleet's life.
func TestAdv4RemotesOncePerAddressBeyondMaxRemotes(t *testing.T) {
	ms := newFleet(t, 2, nil)
	n := ms[0].node
	key := mustKey(t, &Transport{}, "http://upstream.example:80")
	n.setCap(key, 0, "upstream.example:80") // as Transport.upstream does for a name
	kc := n.capOf(key)
	const addrs, rounds = maxRemotes + 1, 50
	for range rounds {
		for i := range addrs {
			n.sawRemote(key, kc, netip.MustParseAddrPort(fmt.Sprintf("10.0.0.%d:80", i+1)))
		}
	}
	b, err := os.ReadFile(n.remotesFile(key))
	if err != nil {
		t.Fatal(err)
	}
	lines := len(strings.Fields(string(b)))
	if lines > addrs {
		t.Errorf("%d dials over %d addresses: %d lines (%d bytes) appended to the addresses file, want %d (once per address per process)",
			rounds*addrs, addrs, lines, len(b), addrs)
	}
}

// TestAdv4RemotesOldAddressOutlivesChurn: the dead worker's connections are
// at the address it dialed; the fleet's file keeps only its last 4 KiB.
// Another member's churn over more than maxRemotes addresses (see above)
// pushes the dead one's address out of that window within a few hundred
// dials, and the member holding the dead one's share no longer counts its
// connections.
func TestAdv4RemotesOldAddressOutlivesChurn(t *testing.T) {
	ms := newFleet(t, 3, nil)
	key := mustKey(t, &Transport{}, "http://upstream.example:80")
	old := netip.MustParseAddrPort("192.0.2.7:80")
	dead := ms[0].node
	dead.setCap(key, 0, "upstream.example:80")
	dead.sawRemote(key, dead.capOf(key), old) // the (soon dead) worker's dial
	live := ms[1].node
	live.setCap(key, 0, "upstream.example:80")
	kc := live.capOf(key)
	for range 40 { // 360 dials, at a few a second: minutes of traffic
		for i := range maxRemotes + 1 {
			live.sawRemote(key, kc, netip.MustParseAddrPort(fmt.Sprintf("10.0.0.%d:80", i+1)))
		}
	}
	got := ms[2].node.fleetRemotes(key)
	for _, a := range got {
		if a == old {
			return
		}
	}
	t.Errorf("after another member's churn, the fleet's addresses for the key are %v: the dead worker's %v is gone", got, old)
}

// TestAdv4RemotesParseKeepsTheNewest: parseRemotes keeps the addresses last
// written: one written early in the window and again at its very end (the
// newest line) is kept when more than maxFleetRemotes differ.
func TestAdv4RemotesParseKeepsTheNewest(t *testing.T) {
	newest := netip.MustParseAddrPort("192.0.2.1:443")
	var b strings.Builder
	fmt.Fprintf(&b, "%v\n", newest)
	for i := range maxFleetRemotes {
		fmt.Fprintf(&b, "10.0.1.%d:443\n", i+1)
	}
	fmt.Fprintf(&b, "%v\n", newest)
	got := parseRemotes([]byte(b.String()))
	for _, a := range got {
		if a == newest {
			return
		}
	}
	t.Errorf("the file's last line is %v; parseRemotes kept %d addresses without it", newest, len(got))
}
