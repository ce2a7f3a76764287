package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// TestAdv58SteadyReaderGetsEveryHead: a sibling that reads steadily, 4 KiB
// every 20 ms or every 50 ms (never a gap near interimStall), gets all 350
// heads and the final response while the queue is full.
//
// When the read loop saw progress only as a write of the flush returned, it
// saw none for about 800 ms: a blocked write on a unix stream socket wakes
// only once the peer has drained the send buffer to a quarter, and the
// exchange failed after about 155 heads (LOW). It then also watched the
// socket's unsent bytes (SIOCOUTQ), which fall only as the peer finishes
// reading a whole write: the flush wrote its whole queue at once, and a
// reader taking 4 KiB every 30 ms failed every time after about 260 heads.
// The flush now writes flushChunk bytes at a time. So does a write of a
// head while the queue is empty: one of 24 KiB (its field fits one HEADERS
// frame, Huffman-coded), written whole, took the same reader six reads to
// free.
//
// An attempt in which the reader itself stalled past interimStall (held up
// by a loaded machine) and the owner gave up is run again, up to five in
// all.
func TestAdv58SteadyReaderGetsEveryHead(t *testing.T) {
	for _, tc := range []struct {
		every        time.Duration
		field, heads int // each head's link field, in bytes; how many
	}{
		{20 * time.Millisecond, 1000, 350},
		{50 * time.Millisecond, 1000, 350},
		{50 * time.Millisecond, 24000, 14},
	} {
		every, heads := tc.every, tc.heads
		t.Run(fmt.Sprintf("%v/%dB", every, tc.field), func(t *testing.T) {
			t.Parallel()
			const attempts = 5
			for range attempts {
				r := steadyRead(t, heads, tc.field, every)
				if r.errFrame && r.maxGap >= interimStall {
					// The reader itself stalled past interimStall (a
					// loaded machine held it up): the owner was right to
					// give up, and this attempt says nothing of a steady
					// reader.
					t.Logf("the reader stalled for %v: again", r.maxGap.Round(time.Millisecond))
					continue
				}
				if r.errFrame || r.n103 != heads || !r.final {
					t.Errorf("a sibling reading 4 KiB every %v (longest gap between reads %v, under interimStall %v) got %d of %d 103s of %d bytes each, final response %v, error frame %q %v; want every 103 and the final response",
						every, r.maxGap.Round(time.Millisecond), interimStall, r.n103, heads, tc.field, r.final, errPeerNotReading, r.errFrame)
				}
				return
			}
			t.Fatalf("the reader stalled past interimStall (%v) in each of %d attempts", interimStall, attempts)
		})
	}
}

// steadyReadResult is what a sibling reading steadily got (steadyRead).
type steadyReadResult struct {
	n103            int
	final, errFrame bool
	maxGap          time.Duration // the longest time between two reads
}

// steadyRead has a sibling ask for a response of heads 103s and a final
// response, and read it 4 KiB at a time, every so often.
func steadyRead(t *testing.T, heads, field int, every time.Duration) steadyReadResult {
	t.Helper()
	link := "<" + strings.Repeat("a", field) + ">; rel=preload"
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

	sc.SetReadDeadline(time.Now().Add(12 * time.Second))
	var got []byte
	buf := make([]byte, 4<<10)
	var r steadyReadResult
	last := time.Now()
	for !bytes.Contains(got, []byte("final")) && !bytes.Contains(got, []byte(errPeerNotReading.Error())) {
		n, err := sc.Read(buf)
		if now := time.Now(); now.Sub(last) > r.maxGap {
			r.maxGap = now.Sub(last)
		}
		last = time.Now()
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
		time.Sleep(every)
	}
	r.n103 = bytes.Count(got, []byte("HTTP/1.1 103 "))
	r.final = bytes.Contains(got, []byte("final"))
	r.errFrame = bytes.Contains(got, []byte(errPeerNotReading.Error()))
	return r
}
