package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestAdv75bOwnerLeavesUnderTunnel: a sibling's upgraded connection (101,
// an echo tunnel) runs on the owner's upstream connection when the owner
// leaves: by Shutdown with a 300 ms drain, or by Close. Shutdown returns
// within its drain plus slack; then the tunnel ends for both its ends
// within 10s (the caller's read fails, the upstream's read sees the close):
// a leaving owner leaves no tunnel running on its behalf.
func TestAdv75bOwnerLeavesUnderTunnel(t *testing.T) {
	for _, how := range []string{"shutdown", "close"} {
		t.Run(how, func(t *testing.T) {
			upEnded := make(chan struct{}, 4)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Upgrade") != "echo" {
					io.WriteString(w, "ok")
					return
				}
				c, brw, err := w.(http.Hijacker).Hijack()
				if err != nil {
					return
				}
				defer c.Close()
				io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
				buf := make([]byte, 64)
				for {
					c.SetReadDeadline(time.Now().Add(30 * time.Second))
					n, err := brw.Read(buf)
					if err != nil {
						upEnded <- struct{}{}
						return
					}
					c.Write(buf[:n])
				}
			}))
			t.Cleanup(up.Close)
			t.Cleanup(up.CloseClientConnections)
			owner, client := remotePair(t, nil)
			warm(t, owner, up.URL+"/warm")
			req, _ := http.NewRequest("GET", up.URL+"/ws", nil)
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "echo")
			resp, err := client.tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 101 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			rwc := resp.Body.(io.ReadWriteCloser)
			defer rwc.Close()
			if client.node.Stats().ReusedRemote == 0 {
				t.Fatalf("the tunnel did not go through the owner")
			}
			br := bufio.NewReader(rwc)
			rwc.Write([]byte("ping\n"))
			if l, err := br.ReadString('\n'); err != nil || l != "ping\n" {
				t.Fatalf("echo: %q %v", l, err)
			}
			start := time.Now()
			if how == "shutdown" {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				owner.node.Shutdown(ctx)
				cancel()
			} else {
				owner.node.Close()
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the owner took %v to leave", d)
			}
			readErr := make(chan error, 1)
			go func() {
				for {
					if _, err := br.ReadString('\n'); err != nil {
						readErr <- err
						return
					}
				}
			}()
			rwc.Write([]byte("after\n"))
			select {
			case <-readErr:
			case <-time.After(10 * time.Second):
				t.Errorf("the caller's tunnel still runs 10s after its owner left")
			}
			select {
			case <-upEnded:
			case <-time.After(10 * time.Second):
				t.Errorf("the upstream's end of the tunnel still open 10s after the owner left")
			}
		})
	}
}
