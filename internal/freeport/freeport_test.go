package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestPickIsFreeAndOutsideTheEphemeralRange: a picked port binds, on every
// address, and lies outside the kernel's ephemeral range, where outgoing
// connections take no port; a port something listens on is never picked.
func TestPickIsFreeAndOutsideTheEphemeralRange(t *testing.T) {
	lo, hi := ephemeralRange()
	if lo == 0 && hi == 65535 {
		t.Fatalf("cannot read the ephemeral range from %s", rangeFile)
	}
	held := map[int]bool{}
	for range 50 {
		port, err := Pick()
		if err != nil {
			t.Fatal(err)
		}
		if port >= lo && port <= hi {
			t.Fatalf("picked %d, inside the ephemeral range %d-%d", port, lo, hi)
		}
		if port < lowest {
			t.Fatalf("picked %d, below %d", port, lowest)
		}
		if held[port] {
			t.Fatalf("picked %d, on which this test listens", port)
		}
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("picked %d, which does not bind: %v", port, err)
		}
		defer ln.Close()
		held[port] = true
	}
}
