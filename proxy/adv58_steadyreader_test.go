package proxy

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// TestAdv58SteadyReaderBelowChunkRateFails: roomFor's doc (and doc.go)
// say that only a sibling that reads *none* of a full queue for
// interimStall fails the exchange, and that one reading slower than the
// upstream sends holds the read loop back as a slow hook would on the local
// path. But the read loop sees progress only when the flush's Write of a
// whole 32 KiB chunk returns, and a blocked Write on a unix stream socket
// is woken only once the peer has drained the send buffer to a quarter
// (unix_writable: wmem*4 <= sndbuf, ~160 KiB with the default 208 KiB): a
// sibling that reads steadily, 4 KiB every 20 ms (200 KiB/s, never a gap
// near 250 ms), makes no visible progress for ~800 ms, and the exchange
// fails with errPeerNotReading after ~155 of 350 heads. (4 KiB every 5 ms
// passes; every 15 ms fails.) So the adv57 finding (b9309d7: a slow but
// steady reader fails where x/net and the local path deliver every head)
// is fixed only for siblings reading faster than ~600 KiB/s; a sibling
// forwarding 1xx to an ordinary slow client falls well below that.
// Severity LOW (as adv57's): the exchange fails with a clear error frame
// and nothing is corrupted, but behaviour differs from x/net / the local
// path and from what the code documents.
func TestAdv58SteadyReaderBelowChunkRateFails(t *testing.T) {
	const heads = 350
	link := "<" + strings.Repeat("a", 1000) + ">; rel=preload"
	up := newRawH2(t, func(s *rawStream) {
		if s.path != "/flood" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		for range heads {
			s.headers(false, ":status", "103", "link", link)
		}
		s.headers(false, ":status", "200", "content-length", "5")
		s.data(true, []byte("final"))
	})
	owner, client := remotePair(t, func(tr *Transport) { h2cConf(tr); tr.MaxResponseHeaderBytes = 64 << 10 })
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	key := mustKey(t, owner.tr, up.url)
	sc := dialOwner(t, owner)
	host := strings.TrimPrefix(up.url, "http://")
	frame, err := appendRequestFrame(nil, siblingLease(t, client, key, 1), time.Now().Add(30*time.Second), 0)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(sc, string(frame)+"GET /flood HTTP/1.1\r\nHost: "+host+"\r\n\r\n")

	// The sibling reads steadily: 4 KiB every 20 ms.
	sc.SetReadDeadline(time.Now().Add(12 * time.Second))
	var got []byte
	buf := make([]byte, 4<<10)
	var maxGap time.Duration
	last := time.Now()
	for !bytes.Contains(got, []byte("final")) && !bytes.Contains(got, []byte(errPeerNotReading.Error())) {
		n, err := sc.Read(buf)
		if now := time.Now(); now.Sub(last) > maxGap {
			maxGap = now.Sub(last)
		}
		last = time.Now()
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	n103 := bytes.Count(got, []byte("HTTP/1.1 103 "))
	if bytes.Contains(got, []byte(errPeerNotReading.Error())) || n103 != heads || !bytes.Contains(got, []byte("final")) {
		t.Errorf("a sibling reading 4 KiB every 20 ms (longest gap between reads %v, under interimStall %v) got %d of %d 103s, final response %v, error frame %q %v; want every 103 and the final response",
			maxGap.Round(time.Millisecond), interimStall, n103, heads, bytes.Contains(got, []byte("final")),
			errPeerNotReading, bytes.Contains(got, []byte(errPeerNotReading.Error())))
	}
}
