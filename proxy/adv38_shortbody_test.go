package proxy

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// openStreams is how many peer streams the owner's server holds open, and
// how many of its exchanges are counted active.
func openStreams(m *member) (streams int, active int64) {
	s := m.node.srv
	s.mu.Lock()
	streams = len(s.conns)
	s.mu.Unlock()
	return streams, s.active.Load()
}

// TestAdv38PeerGoneDuringShortBodyWait: a sibling sends a head and a short
// body past the owner's read buffer, all but its last byte, and then closes
// its stream (it died, or its caller gave up between the two writes that
// carry such a request). The owner waits in the socket for the body's end
// (awaitQueued); the close must end that wait at once, as a close ends the
// wait for a head that fits the buffer, rather than hold the stream's
// goroutine, and the exchange count Shutdown drains, until peerHeadTimeout.
func TestAdv38PeerGoneDuringShortBodyWait(t *testing.T) {
	_, owner, client, oc := soleIdleConn(t)
	head := fmt.Sprintf("POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", maxBodyWithHead)
	frame := fmt.Append(leaseFrame(t, client, oc, time.Time{}, 0), head, strings.Repeat("b", maxBodyWithHead-1))
	sc := dialOwner(t, owner)
	if _, err := sc.Write(frame); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	sc.Close()
	var streams int
	var active int64
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if streams, active = openStreams(owner); streams == 0 && active == 0 {
			return
		}
	}
	t.Fatalf("2s after the sibling closed its stream mid short body, the owner still holds %d streams, %d exchanges active", streams, active)
}

// TestAdv38ShortBodyTailInSmallWrites: a sibling sends a short body past the
// owner's read buffer whose end comes in many small writes (a peer that does
// not buffer its writes). The owner waits for those bytes without reading
// them (MSG_PEEK); each write is a buffer of its own in the unix socket,
// charged whole to the sender, so a sender that nobody reads stops after a
// few hundred of them, and the wait must not depend on the socket holding
// them all: the request, sent whole within its time, must be answered.
func TestAdv38ShortBodyTailInSmallWrites(t *testing.T) {
	_, owner, client, oc := soleIdleConn(t)
	// A head of 1.5 KiB (a cookie): head and body overrun the read
	// buffer by that much, more than the tail of one-byte writes.
	head := fmt.Sprintf("POST /small HTTP/1.1\r\nHost: x\r\nCookie: %s\r\nContent-Length: %d\r\n\r\n",
		strings.Repeat("c", 1536), maxBodyWithHead)
	const tail = 1024
	frame := fmt.Append(leaseFrame(t, client, oc, time.Time{}, 0), head, strings.Repeat("b", maxBodyWithHead-tail))
	sc := dialOwner(t, owner)
	sc.SetDeadline(time.Now().Add(3 * time.Second))
	werr := make(chan error, 1)
	go func() {
		if _, err := sc.Write(frame); err != nil {
			werr <- err
			return
		}
		for i := 0; i < tail; i++ {
			if _, err := sc.Write([]byte{'b'}); err != nil {
				werr <- fmt.Errorf("byte %d of the body's last %d: %w", i, tail, err)
				return
			}
		}
		werr <- nil
	}()
	rf, err := readFrame(bufio.NewReader(sc), respHeaderLen, decodeResponseFrame)
	if err != nil {
		t.Fatalf("no answer within 3s to a short body whose last %d bytes came one a write: %v (writer: %v)", tail, err, <-werr)
	}
	if rf.typ != frameAccept {
		t.Fatalf("answer %d (%s), want an accept (%d)", rf.typ, rf.msg, frameAccept)
	}
}

// TestAdv38HalfLargeHeadHoldsNoConnection: TestHalfSentHeadHoldsNoConnection
// for a head larger than the owner's 4 KiB read buffer (a large cookie, well
// within the header limit): a sibling that sends half of it and stalls must
// not take up the key's only connection for peerHeadTimeout.
func TestAdv38HalfLargeHeadHoldsNoConnection(t *testing.T) {
	base, owner, client, oc := soleIdleConn(t)
	half := "GET /small HTTP/1.1\r\nHost: x\r\nCookie: " + strings.Repeat("c", 6<<10)
	frame := fmt.Append(leaseFrame(t, client, oc, time.Time{}, flagBodyOnAccept), half)
	if _, err := dialOwner(t, owner).Write(frame); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	start := time.Now()
	if err := getBody(ctx, owner.tr, base+"/small"); err != nil {
		t.Fatalf("the owner's own request, behind a sibling's half head of 6 KiB: %v after %v (served remote %d)",
			err, time.Since(start).Round(time.Millisecond), owner.node.Stats().ServedRemote)
	}
}
