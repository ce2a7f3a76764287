package proxy

import (
	"net"
	"net/http"
	"sync/atomic"
	"testing"
)

// TestAdv72aH2CNeverDialsForRelays: an uncapped h2c upstream's one
// connection carries every process's streams: a client that sends many
// requests in a row through the owner's connection never dials one of its
// own. (A concurrent burst of 12 sometimes dials a second connection, on the
// parent commit too: not this change.)
func TestAdv72aH2CNeverDialsForRelays(t *testing.T) {
	var conns atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}}
	hs.Protocols = new(http.Protocols)
	hs.Protocols.SetUnencryptedHTTP2(true)
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	url := "http://" + ln.Addr().String()
	ms := newFleet(t, 2, func(tr *Transport) { tr.H2C = true })
	owner, client := ms[0], ms[1]
	warm(t, owner, url)
	for i := range 3 * relaysPerDial {
		if _, _, err := adv10Do(t, client.tr, "GET", url, nil); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if st := client.node.Stats(); st.Created != 0 || conns.Load() != 1 {
		t.Fatalf("h2c: client dialed %d, upstream accepted %d connections (%+v)", st.Created, conns.Load(), st)
	}
}
