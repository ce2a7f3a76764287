package proxy

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestAdv37HalfShortBodyPastBufferHoldsNoConnection: the short body a frame
// without flagBodyOnAccept carries with its head may be as long as
// maxBodyWithHead, which is the whole of the owner's read buffer, so head
// and body together need not fit it. A sibling that sends such a head and
// all but the last byte of its body, then stalls, must cost the owner a
// timer, not its only connection of the key, as the half short body of
// TestHalfSentHeadHoldsNoConnection does.
func TestAdv37HalfShortBodyPastBufferHoldsNoConnection(t *testing.T) {
	base, owner, client, oc := soleIdleConn(t)
	head := fmt.Sprintf("POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", maxBodyWithHead)
	frame := fmt.Append(leaseFrame(t, client, oc, time.Time{}, 0), head, strings.Repeat("b", maxBodyWithHead-1))
	if _, err := dialOwner(t, owner).Write(frame); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	start := time.Now()
	if err := getBody(ctx, owner.tr, base+"/small"); err != nil {
		t.Fatalf("the owner's own request, behind a sibling's short body of %d bytes sent but its last: %v after %v (served remote %d)",
			maxBodyWithHead, err, time.Since(start).Round(time.Millisecond), owner.node.Stats().ServedRemote)
	}
}

// TestAdv37WholeShortBodyPastBufferServed: a short body of maxBodyWithHead
// bytes sent whole with its head, which together overrun the owner's read
// buffer, is served at once: the wait for its end past the buffer ends
// when the bytes are in.
func TestAdv37WholeShortBodyPastBufferServed(t *testing.T) {
	_, owner, client, oc := soleIdleConn(t)
	head := fmt.Sprintf("POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", maxBodyWithHead)
	frame := fmt.Append(leaseFrame(t, client, oc, time.Time{}, 0), head, strings.Repeat("b", maxBodyWithHead))
	sc := dialOwner(t, owner)
	sc.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := sc.Write(frame); err != nil {
		t.Fatal(err)
	}
	rf, err := readFrame(bufio.NewReader(sc), respHeaderLen, decodeResponseFrame)
	if err != nil {
		t.Fatalf("no answer within 2s to a whole short body past the buffer: %v", err)
	}
	if rf.typ != frameAccept {
		t.Fatalf("answer %d (%s), want an accept (%d)", rf.typ, rf.msg, frameAccept)
	}
}
