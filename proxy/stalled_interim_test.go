package proxy

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestH2StalledSiblingInterimKeepsSharedConn: a sibling's caller that reads
// interim responses (Caddy's reverse proxy always does) and stops reading
// its stream, while the upstream sends it a run of 103s, must not block the
// read loop of the HTTP/2 connection that every exchange on it shares: the
// owner's own request on that connection answers at once. The heads the
// stream had no room for wait for the sibling, which, reading again, gets
// every one and then the final response.
func TestH2StalledSiblingInterimKeepsSharedConn(t *testing.T) {
	owner, url, sc := stalledFlood(t, h2cConf)
	time.Sleep(300 * time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	if err := getOK(owner, ctx, url+"/"); err != nil {
		t.Fatalf("the owner's own GET on the shared HTTP/2 connection, while a sibling that reads nothing gets 103s: %v after %v",
			err, time.Since(start).Round(time.Millisecond))
	}
	if s := owner.node.Stats(); s.Created != 1 {
		t.Fatalf("the owner's GET went on a new connection (%+v): the test did not share one", s)
	}

	// The sibling reads now: every 103, then the final response (its body
	// chunked, as the relay frames an HTTP/2 body).
	sc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []byte
	buf := make([]byte, 64<<10)
	for !bytes.Contains(got, []byte("final")) {
		n, err := sc.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("after %d bytes and %d 103s: %v", len(got), bytes.Count(got, []byte("HTTP/1.1 103 ")), err)
		}
	}
	if n := bytes.Count(got, []byte("HTTP/1.1 103 ")); n != floodHeads {
		t.Errorf("the stream carried %d of the %d 103s before the final response", n, floodHeads)
	}
}

// TestH2StalledSiblingFullQueueFailsAlone: a sibling that reads none of a
// flood longer than the header limit holds the shared read loop back at
// most interimStall, once: the owner's own request on the connection
// answers, and the stalled exchange fails, its stream ending with the
// heads that were queued and an error frame that says why.
func TestH2StalledSiblingFullQueueFailsAlone(t *testing.T) {
	owner, url, sc := stalledFlood(t, func(tr *Transport) { h2cConf(tr); tr.MaxResponseHeaderBytes = 64 << 10 })
	time.Sleep(100 * time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	if err := getOK(owner, ctx, url+"/"); err != nil {
		t.Fatalf("the owner's own GET on the shared HTTP/2 connection: %v after %v", err, time.Since(start).Round(time.Millisecond))
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the owner's own GET took %v: the read loop waited on the stalled sibling longer than interimStall (%v)", d.Round(time.Millisecond), interimStall)
	}
	if s := owner.node.Stats(); s.Created != 1 {
		t.Fatalf("the owner's GET went on a new connection (%+v): the test did not share one", s)
	}

	sc.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(sc)
	if err != nil {
		t.Fatalf("the stalled exchange's stream did not end: %v after %d bytes", err, len(got))
	}
	if bytes.Contains(got, []byte("HTTP/1.1 200 ")) || bytes.Contains(got, []byte("final")) {
		t.Error("the stalled exchange's final response went out after the heads it could not queue")
	}
	if !bytes.Contains(got, []byte(errPeerNotReading.Error())) {
		t.Errorf("the stream (%d bytes, %d 103s) ended without an error frame saying %q", len(got), bytes.Count(got, []byte("HTTP/1.1 103 ")), errPeerNotReading)
	}
}

// floodHeads is how many 103s the flooding upstream sends before its 200.
const floodHeads = 5000

// stalledFlood starts an HTTP/2 upstream that answers /flood with
// floodHeads 103s and then a 200 whose body is "final", and an owner and a
// sibling on one connection to it (conf sets up both Transports). The
// sibling's raw stream sends a GET /flood, with a 1xx hook, and reads
// nothing: the caller reads it.
func stalledFlood(t *testing.T, conf func(*Transport)) (owner *member, url string, sc net.Conn) {
	t.Helper()
	up := newRawH2(t, func(s *rawStream) {
		if s.path != "/flood" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		for range floodHeads {
			s.headers(false, ":status", "103", "link", "</style.css>; rel=preload; as=style")
		}
		s.headers(false, ":status", "200", "content-length", "5")
		s.data(true, []byte("final"))
	})
	owner, client := remotePair(t, conf)
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	key := mustKey(t, owner.tr, up.url)
	sc = dialOwner(t, owner)
	host := strings.TrimPrefix(up.url, "http://")
	frame, err := appendRequestFrame(nil, siblingLease(t, client, key, 1), time.Now().Add(30*time.Second), 0)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(sc, string(frame)+"GET /flood HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	return owner, up.url, sc
}
