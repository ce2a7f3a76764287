package proxy

import (
	"testing"
	"time"
)

// TestAdv69bSpareKeepsItsMakersLimits: two Transports share a Node and an
// upstream (one key). A connection keeps the limits of the Transport that
// made it (connSettings: "the per-connection limits of the Transport that
// made it"), as one in the table does, whoever reuses it: one that A made
// under MaxRequestsPerConn 2 never carries a third request, even after B
// (no limit) used it outside a full table.
func TestAdv69bSpareKeepsItsMakersLimits(t *testing.T) {
	for _, full := range []bool{false, true} {
		name := "table"
		if full {
			name = "spares"
		}
		t.Run(name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			up, _ := newAdv69bUpstream(t, false, adv69bAnswer(release))
			m := newMemberOpts(t, adv69bSpec, NodeOptions{SweepInterval: time.Hour}, func(tr *Transport) { tr.MaxRequestsPerConn = 2 })
			a := m.tr
			b := &Transport{Node: m.node}
			if full {
				// B holds the table (its own connections, no limit).
				adv69bHold(t, b, up.url, 2)
			}
			count := map[string]int{}
			for i, tr := range []*Transport{a, b, a, b, a} {
				_, addr, err := adv69bDo(t, tr, "GET", up.url+"/conn", "")
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				count[addr]++
				if addr == "" {
					t.Fatalf("request %d: empty address", i)
				}
			}
			// The first connection was A's: it carries at most 2.
			for addr, n := range count {
				if n > 2 {
					t.Fatalf("connection %s carried %d requests (%v); A made it under MaxRequestsPerConn 2", addr, n, count)
				}
			}
		})
	}
}
