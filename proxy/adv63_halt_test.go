package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An exchange of a sibling that fails before the owner accepted its body
// (the owner's writer still waits for the upstream's 100) halts the peer
// stream's reader (stopBody), yet the stream stays in step and carries the
// next exchange. bgReader.halted is never cleared: the next exchange whose
// watch runs while it waits for its 100 has its read deadline left in the
// past by bodyWanted's abortPendingRead, and its body read fails at once.
// net/http (and the owner's own path) carry the second request fine.
func TestAdv63HaltOutlivesItsExchange(t *testing.T) {
	body := bytes.Repeat([]byte("b"), 16<<10) // too long to go with the head
	url := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		switch req.URL.Path {
		case "/fail":
			// Malformed answer while the writer waits for the 100.
			io.WriteString(c, "HTTP/1.1 abc\r\n\r\n")
			return false
		case "/slow100":
			time.Sleep(40 * time.Millisecond) // the watch runs meanwhile
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
			n, _ := io.Copy(io.Discard, req.Body)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return n == int64(len(body))
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	owner, client := remotePair(t, func(tr *Transport) { tr.ExpectContinueTimeout = 5 * time.Second })
	post := func(rt http.RoundTripper, path string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", url+path, bytes.NewReader(body))
		req.Header.Set("Expect", "100-continue")
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.Status + " " + string(b), err
	}
	ref := &http.Transport{ExpectContinueTimeout: 5 * time.Second}
	defer ref.CloseIdleConnections()
	for _, p := range []struct {
		name string
		rt   http.RoundTripper
	}{{"reference", ref}, {"owner", owner.tr}, {"sibling", client.tr}} {
		for i := 0; i < 3; i++ {
			warm(t, owner, url+"/")
			if _, err := post(p.rt, "/fail"); err == nil {
				t.Fatalf("%s: POST /fail succeeded", p.name)
			}
			warm(t, owner, url+"/")
			remote := client.node.Stats().ReusedRemote
			got, err := post(p.rt, "/slow100")
			if err != nil || !strings.HasSuffix(got, "ok") {
				t.Fatalf("%s, round %d: the POST after a failed Expect POST: %q, %v; want 200 ok as the reference gets", p.name, i, got, err)
			}
			if p.name == "sibling" && client.node.Stats().ReusedRemote == remote {
				t.Fatalf("the sibling's POST did not go through the owner")
			}
		}
	}
}
