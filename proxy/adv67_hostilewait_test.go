package proxy

import (
	"context"
	"encoding/binary"
	"testing"
	"time"
)

// TestAdv67HostileWaitLeftLosesNothing: a sibling (buggy or hostile, same
// uid) presents a valid lease on the owner's only connection of a key in a
// frame whose wait left is 0, past 1<<62, or negative as an int64, or is
// cut inside the field (then the stream stalls, or closes). The owner
// drops that stream (ErrBadFrame) or waits for the rest; either way the
// lease must cost the fleet nothing for long: the owner's own request for
// the key is served within a second or so, and the owner keeps serving
// siblings (a well-formed frame on a new stream is answered).
func TestAdv67HostileWaitLeftLosesNothing(t *testing.T) {
	const head = "GET /small HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, tc := range []struct {
		name  string
		patch func(f []byte) []byte
		close bool
	}{
		{"zero", func(f []byte) []byte { binary.BigEndian.PutUint64(f[len(f)-8:], 0); return f }, false},
		{"past 1<<62", func(f []byte) []byte { binary.BigEndian.PutUint64(f[len(f)-8:], 1<<62+1); return f }, false},
		{"negative", func(f []byte) []byte { binary.BigEndian.PutUint64(f[len(f)-8:], 1<<63); return f }, false},
		{"all ones", func(f []byte) []byte { binary.BigEndian.PutUint64(f[len(f)-8:], ^uint64(0)); return f }, false},
		{"one nanosecond", func(f []byte) []byte { binary.BigEndian.PutUint64(f[len(f)-8:], 1); return f }, false},
		{"cut in the field, stalled", func(f []byte) []byte { return f[:len(f)-3] }, false},
		{"cut in the field, closed", func(f []byte) []byte { return f[:len(f)-3] }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, owner, client, oc := soleIdleConn(t)
			lease, err := client.pool.Reserve(oc.id)
			if err != nil {
				t.Fatal(err)
			}
			lb, _ := lease.AppendBinary(nil)
			frame, err := appendRequestFrameWait(nil, lb, time.Time{}, flagBodyOnAccept, -1, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			frame = tc.patch(frame)
			sc := dialOwner(t, owner)
			msg := frame
			if len(frame) == len(lb)+reqHeaderLen+8 {
				msg = append(frame, head...)
			}
			if _, err := sc.Write(msg); err != nil {
				t.Fatal(err)
			}
			if tc.close {
				sc.Close()
			}
			time.Sleep(50 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancel()
			start := time.Now()
			if err := getBody(ctx, owner.tr, base+"/small"); err != nil {
				t.Fatalf("the owner's own request after a sibling's frame (%s): %v after %v", tc.name, err, time.Since(start).Round(time.Millisecond))
			}
			if d := time.Since(start); d > 3*time.Second { // the reservation ages out in 1 s
				t.Errorf("the owner's own request after a sibling's frame (%s) took %v", tc.name, d.Round(time.Millisecond))
			}
			// The sibling's next request, through the transport.
			ctx2, cancel2 := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancel2()
			if err := getBody(ctx2, client.tr, base+"/small"); err != nil {
				t.Errorf("the sibling's next request: %v", err)
			}
		})
	}
}
