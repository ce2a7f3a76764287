package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestCappedUpstreamWaitsForRoom: with the table full of a capped
// upstream's long-lived streams, a request to it waits for one of them (or
// for room), as at its cap: served when a stream ends within wait_timeout,
// refused with 503 table_full when none does.
func TestCappedUpstreamWaitsForRoom(t *testing.T) {
	release := make(chan struct{})
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) })
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			io.WriteString(w, "first")
			w.(http.Flusher).Flush()
			<-release
			return
		}
		io.WriteString(w, "ok")
	}), false)
	port := freePort(t)
	startCaddy(t, "conns_per_process 2", site(port, up.hostport(), "max_conns_per_host 8\n\t\t\twait_timeout 1s", ""))
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := &http.Client{Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	var streams []*http.Response
	for range 2 {
		resp, err := c.Get(base + "/stream")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		streams = append(streams, resp)
	}

	start := time.Now()
	resp, err := c.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if took := time.Since(start); resp.StatusCode != 503 || string(b) != "refused: table_full" || took < 800*time.Millisecond {
		t.Fatalf("with both streams held: %d %q after %v; want 503 table_full after wait_timeout", resp.StatusCode, b, took)
	}

	done := make(chan string, 1)
	go func() {
		resp, err := c.Get(base + "/")
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	time.Sleep(100 * time.Millisecond)
	releaseOnce.Do(func() { close(release) })
	for _, s := range streams {
		io.Copy(io.Discard, s.Body)
	}
	if got := <-done; got != "200 ok" {
		t.Fatalf("a request waiting as a stream ends: %s; want 200 ok", got)
	}
}
