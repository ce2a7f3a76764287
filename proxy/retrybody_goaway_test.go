package proxy

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestGoAwayRetriesAnUnreadStreamWhole is TestRetriedBodyKeepsItsEarlierAttemptsCloses
// end to end, locally and through a sibling: a bidirectional stream whose
// first attempt the upstream leaves out of a GOAWAY before it read a byte
// of the body (the request waits for 100-continue) is sent again on a new
// connection, and there it streams both ways to its trailers. The first
// attempt's close of the body, pending while the body was unread, or sent
// late on a goroutine of its own by the owner, must not cut the second
// attempt's body once its response has begun.
func TestGoAwayRetriesAnUnreadStreamWhole(t *testing.T) {
	var mu sync.Mutex
	attempts := map[string]int{}
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		mu.Lock()
		attempts[s.path]++
		first := attempts[s.path] == 1
		mu.Unlock()
		if first {
			s.goAway(s.id - 2)
			return
		}
		s.headers(false, ":status", "100")
		s.headers(false, ":status", "200", "content-type", "application/grpc")
		for p := range s.received {
			if s.data(false, p) != nil {
				return
			}
		}
		s.headers(true, "grpc-status", "0")
	})
	owner, client := remotePair(t, func(tr *Transport) { h2cConf(tr); tr.ExpectContinueTimeout = 5 * time.Second })
	for _, m := range []*member{owner, client} {
		path := "/early/stream/" + map[bool]string{true: "owner", false: "sibling"}[m == owner]
		t.Run(path, func(t *testing.T) {
			if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			pr, pw := io.Pipe()
			defer pw.Close()
			req := grpcReq(t, ctx, up.url+path, pr)
			req.Header.Set("Expect", "100-continue")
			got, errc := headAsync(m.tr, req)
			var resp *http.Response
			select {
			case resp = <-got:
			case err := <-errc:
				t.Fatalf("the stream was not sent again: %v", err)
			}
			defer resp.Body.Close()
			for _, msg := range []string{"first message", "second message"} {
				go pw.Write([]byte(msg))
				echo := make([]byte, len(msg))
				if _, err := io.ReadFull(resp.Body, echo); err != nil || string(echo) != msg {
					t.Fatalf("echo of %q: %q, %v", msg, echo, err)
				}
			}
			pw.Close()
			if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
				t.Fatalf("after the last message: %q, %v", rest, err)
			}
			if s := resp.Trailer.Get("grpc-status"); s != "0" {
				t.Errorf("trailer grpc-status %q, want 0", s)
			}
			mu.Lock()
			n := attempts[path]
			mu.Unlock()
			if n != 2 {
				t.Errorf("the upstream saw %d attempts, want 2: one went away, one answered", n)
			}
		})
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's stream did not go through the owner: %+v", s)
	}
}
