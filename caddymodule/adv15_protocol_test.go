package caddymodule

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orbitproxy/orbit/orbitpool"
	"github.com/orbitproxy/orbit/proxy"
)

// TestFleetOfAnotherProtocolRefused: a process whose build speaks another
// version of the unix leg than a fleet's members (two overlapping fleets of
// different builds on one segment) would share the table and fail every
// request it sent to a member of the other build. It must not join: the
// fleet does not open, with an error that says why.
func TestFleetOfAnotherProtocolRefused(t *testing.T) {
	dir := t.TempDir()
	a := &App{Segment: filepath.Join(dir, "seg"), SocketDir: filepath.Join(dir, "sock"), Processes: 4, Keys: 16, ConnsPerProcess: 16}
	a.setDefaults()
	cfg := a.fleetConfig()
	other := cfg.spec()
	other.Protocol = proxy.Protocol + 1
	member, err := orbitpool.Open(other, orbitpool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { member.Close() }()

	f, err := openFleet(cfg, nil)
	if err == nil {
		f.Destruct()
		t.Fatal("a process of another protocol joined the fleet")
	}
	if !errors.Is(err, orbitpool.ErrIncompatible) || !strings.Contains(err.Error(), "protocol") {
		t.Fatalf("error %q; want ErrIncompatible naming the protocol", err)
	}

	// A member of this build's protocol is joined.
	member.Close()
	same := other
	same.Protocol = proxy.Protocol
	if member, err = orbitpool.Open(same, orbitpool.Options{}); err != nil {
		t.Fatal(err)
	}
	f, err = openFleet(cfg, nil)
	if err != nil {
		t.Fatalf("joining a member of protocol %d: %v", proxy.Protocol, err)
	}
	f.Destruct()
}
