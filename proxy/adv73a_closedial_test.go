package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
)

// TestAdv73aOwedDialToClosingUpstream: an upstream at its connection limit
// accepts new connections and closes them at once (a common overload
// response); its one established connection, the owner's, still serves. A
// sibling relays through it relaysPerDial times, then its next requests
// owe a dial. Each GET must be served: the dial relays paid for is only a
// preference, and the sibling's idle connection serves the request as it
// served those before it.
func TestAdv73aOwedDialToClosingUpstream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	serveConns(t, ln, func(c net.Conn, id int) {
		accepted.Add(1)
		if id > 1 {
			return // closed at once
		}
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	url := "http://" + ln.Addr().String() + "/"
	ms := newFleet(t, 2, nil)
	owner, client := ms[0], ms[1]
	warm(t, owner, url)
	var failed []string
	for i := range 5 * (relaysPerDial + 1) {
		if _, body, err := adv10Do(t, client.tr, "GET", url, nil); err != nil || body != "ok" {
			failed = append(failed, fmt.Sprintf("#%d: %q retry-safe=%v %v", i, body, IsRetrySafe(err), err))
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d GETs failed with the owner's connection idle (client %+v, upstream accepted %d): %v", len(failed), 5*(relaysPerDial+1), client.node.Stats(), accepted.Load(), failed)
	}
}
