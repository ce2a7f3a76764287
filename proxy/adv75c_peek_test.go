package proxy

import (
	"net"
	"strings"
	"testing"
	"time"
)

// TestAdv75cPooledStreamStaleBytes: the client keeps one idle stream to the
// owner; the owner's end then gets, unasked: a stray HTTP answer, a stray
// frame-like answer, a refusal frame (stream left open), or is closed
// outright (EOF, no refusal). The client's next request must get its own
// answer (never the stray), through the sibling still; a stray that is not
// a refusal is logged as such, a refusal is not.
func TestAdv75cPooledStreamStaleBytes(t *testing.T) {
	for _, how := range []string{"stray-http", "stray-error-frame", "refusal", "closed"} {
		t.Run(how, func(t *testing.T) {
			u := newAdv75bUpstream(t, nil)
			owner, client, logs := adv75cPair(t, 0)
			url := u.srv.URL
			warm(t, owner, url+"/?q=warm")
			if got, err := adv75cDo(t, client, "GET", url+"/?q=one", nil, 10*time.Second); err != nil || got != "GET::one" {
				t.Fatalf("first: %q %v", got, err)
			}
			if n := client.node.Stats().IdlePeerConns; n != 1 {
				t.Fatalf("idle streams = %d, want 1", n)
			}
			var sc net.Conn
			waitFor(t, 5*time.Second, "owner's stream idle", func() bool {
				owner.node.srv.mu.Lock()
				defer owner.node.srv.mu.Unlock()
				sc = nil
				for c, busy := range owner.node.srv.conns {
					if busy || sc != nil {
						return false
					}
					sc = c
				}
				return sc != nil
			})
			switch how {
			case "stray-http":
				sc.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nSTRAY"))
			case "stray-error-frame":
				sc.Write(appendResponseFrame(nil, responseFrame{typ: frameError, code: 1, msg: "stray"}))
			case "refusal":
				sc.Write(leavingFrame)
			case "closed":
				sc.Close()
			}
			time.Sleep(20 * time.Millisecond)
			served := owner.node.Stats().ServedRemote
			got, err := adv75cDo(t, client, "GET", url+"/?q=two", nil, 10*time.Second)
			if err != nil {
				t.Fatalf("request after stale bytes on the pooled stream failed: %v", err)
			}
			if got != "GET::two" {
				t.Fatalf("request got %q, want GET::two", got)
			}
			if owner.node.Stats().ServedRemote <= served {
				t.Fatalf("second request did not go through the sibling: %+v", owner.node.Stats())
			}
			warned := 0
			for _, e := range logs.All() {
				if strings.Contains(e.Message, "bytes nobody asked for") {
					warned++
				}
			}
			switch how {
			case "stray-http", "stray-error-frame":
				if warned != 1 {
					t.Fatalf("stray bytes logged %d times, want 1", warned)
				}
			default:
				if warned != 0 {
					t.Fatalf("%s logged as stray bytes %d times", how, warned)
				}
			}
		})
	}
}
