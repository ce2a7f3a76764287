package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv32OwnerStartsExchangePastDeadline: the owner judges a lease's
// deadline when the frame arrives, then waits for the request head until
// the deadline plus ownerDeadlineGrace, and then takes a worker and starts
// the exchange without judging the deadline again (budget's fast path asks
// the governor only). A head that comes in after the deadline (a slow
// sibling, a stalled socket) is sent upstream for a caller that has already
// given up and answered 504: for a POST, the upstream acts on a request the
// client was told failed. Every claim point refuses past the deadline
// (DESIGN, seed 001); so must this one.
func TestAdv32OwnerStartsExchangePastDeadline(t *testing.T) {
	u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		return adv10Fresh(c, req, conn, n)
	})
	owner, client := remotePair(t, nil)
	warm(t, owner, u.url("/warm"))
	kreq, _ := http.NewRequest("GET", u.url("/"), nil)
	_, key, err := client.tr.Upstream(kreq)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	sc, frame := leasedStream(t, owner, client, key, 1, deadline)
	sc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := sc.Write(frame); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(deadline) + 40*time.Millisecond) // past the deadline, within the owner's grace
	host := strings.TrimPrefix(u.base, "http://")
	io.WriteString(sc, "GET /late HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	br := bufio.NewReader(sc)
	if _, err := readFrame(br, respHeaderLen, decodeResponseFrame); err != nil {
		t.Fatalf("no answer to the frame: %v", err)
	}
	sc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	io.Copy(io.Discard, br)
	for _, r := range u.requests() {
		if strings.HasSuffix(r, "/late") {
			t.Fatalf("the owner sent upstream a request whose head came in after its deadline: %q", u.requests())
		}
	}
}
