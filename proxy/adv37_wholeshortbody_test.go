package proxy

import (
	"bufio"
	"fmt"
	"strings"
	"testing"
	"time"
)

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
