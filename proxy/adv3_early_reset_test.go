package proxy

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv3EarlyResetConnectionRecordedAsClosedEarly: an upstream that
// closes (resets) every new connection as it accepts it, nothing of the
// fleet's held there. The GET fails, as it should. But the failed
// connection retires through retireToward(failed): halfClose's shutdown on
// the reset socket fails (ENOTCONN), so closeAfterPeer reports the peer did
// not close, and the connection the upstream threw away at once was taken
// for one "closed early while the upstream still held it": closedEarly
// wrote it to the fleet's file, and lingeredInVain logged the upstream
// "slow to close" and switched the key's failed connections to close at
// once for a minute.
func TestAdv3EarlyResetConnectionRecordedAsClosedEarly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			time.Sleep(5 * time.Millisecond) // the request has arrived: close resets
			c.Close()
		}
	}()
	url := "http://" + ln.Addr().String() + "/"
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, FailedCloseWait: 300 * time.Millisecond},
		func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	key, kc := adv3EarlyKey(t, m, url)

	const n = 1
	for range n {
		if err := getBody(context.Background(), m.tr, url); err == nil {
			t.Fatal("GET to an upstream that resets every connection succeeded")
		}
	}
	time.Sleep(200 * time.Millisecond) // the retires
	kc.earlyMu.Lock()
	early := len(kc.early)
	kc.earlyMu.Unlock()
	b, _ := os.ReadFile(m.node.earlyFile(key))
	noLinger := time.Duration(kc.noLingerUntil.Load() - sinceStart(time.Now()))
	t.Logf("after %d reset connections: kc.early has %d, %s has %d bytes, failed connections close at once for %v more", n, early, filepath.Base(m.node.earlyFile(key)), len(b), noLinger.Round(time.Second))
	if early > 0 || len(b) > 0 {
		t.Errorf("connections the upstream reset as it accepted them were recorded as closed early (%d in kc.early, file %d bytes): none was ever left to the upstream", early, len(b))
	}
	if noLinger > 0 {
		t.Errorf("an upstream that closed at once was taken for one slow to close: the key's failed connections close at once for %v", noLinger.Round(time.Second))
	}
}

// adv3EarlyKey returns the key and the keyCap m's transport uses for url,
// made as its first request would make them.
func adv3EarlyKey(t *testing.T, m *member, url string) (orbitpool.Key, *keyCap) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	e, err := m.tr.upstream(req)
	if err != nil {
		t.Fatal(err)
	}
	kc := m.node.capOf(e.key)
	if kc == nil {
		t.Fatal("no keyCap after setCap")
	}
	return e.key, kc
}
