package proxy

import (
	"bufio"
	"bytes"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestLeavingRefusesEveryIdleStream: a closing owner leaves its refusal on
// every stream that carries no exchange, so that a request a sibling has
// just sent on one goes elsewhere rather than failing with the stream. One
// peer that reads none of its refusals (its stream full, the owner's write
// of a refusal blocked in it) must not cost the other streams theirs, nor
// hold Close up; and the refusal must not hang on a clock that a slow
// close (a loaded machine, a stop of the world) can run out.
func TestLeavingRefusesEveryIdleStream(t *testing.T) {
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	owner := newMember(t, spec, nil)
	sock := SocketPath(SocketDir(spec.Path), owner.pool.Lane())
	frame, err := appendRequestFrame(nil, []byte("no such lease"), time.Time{}, flagBodyOnAccept)
	if err != nil {
		t.Fatal(err)
	}
	frame = append(frame, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"...)
	flooder, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		flooder.Write(bytes.Repeat(frame, 40000))
	}()
	t.Cleanup(func() {
		flooder.Close()
		<-wrote
	})
	// Until the owner's refusals fill the flooder's stream.
	for last, start := uint64(0), time.Now(); ; {
		time.Sleep(100 * time.Millisecond)
		n := owner.node.Stats().Refused
		if n > 0 && n == last {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the owner still reads the flooder's frames after 10s (%d refused)", n)
		}
		last = n
	}
	const idle = 24
	var streams []net.Conn
	for range idle {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		streams = append(streams, c)
	}
	time.Sleep(100 * time.Millisecond) // every stream accepted and waiting for its frame
	start := time.Now()
	owner.node.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Close took %v with a peer that reads none of its refusals", d)
	}
	refused := 0
	for i, c := range streams {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		f, err := readFrame(bufio.NewReader(c), respHeaderLen, decodeResponseFrame)
		if err != nil {
			t.Errorf("idle stream %d: no refusal as the owner closed: %v", i, err)
			continue
		}
		if f.typ != frameReject || f.code != rejectClosing {
			t.Errorf("idle stream %d: frame %v code %d, want a refusal as closing", i, f.typ, f.code)
			continue
		}
		refused++
	}
	if refused != idle {
		t.Errorf("%d of %d idle streams were refused as the owner closed", refused, idle)
	}
}
