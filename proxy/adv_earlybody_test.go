package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
)

// firstRead returns what one Read of a large buffer gives on a fresh
// response's body.
func firstRead(t *testing.T, rt http.RoundTripper, url string) string {
	t.Helper()
	resp, err := get(t, context.Background(), rt, url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 1024)
	n, err := resp.Body.Read(buf)
	return fmt.Sprintf("%q, %v", buf[:n], err)
}

// TestAdvEarlyBodyLastReadEOF: net/http's body of a Content-Length
// response returns io.EOF with the read that reaches the end (transfer.go:
// "If we can return an EOF here along with the read data, do so"), and so
// did the proxy's body before the early body. earlyBody returns the bytes
// with a nil error and io.EOF only on the next Read.
func TestAdvEarlyBodyLastReadEOF(t *testing.T) {
	u := newTestUpstream(t)
	std := &http.Transport{DisableCompression: true}
	defer std.CloseIdleConnections()
	want := firstRead(t, std, u.url("/cl"))
	paths(t, func(tr *Transport) { tr.DisableCompression = true }, func(t *testing.T, rt http.RoundTripper, owner *member, _ func() http.RoundTripper) {
		warm(t, owner, u.url("/cl"))
		if got := firstRead(t, rt, u.url("/cl")); got != want {
			t.Errorf("one Read of a small Content-Length body: %s; net/http: %s", got, want)
		}
	})
}

// canceledRead returns what reading a response's body gives after the
// request's context was canceled once the response came back.
func canceledRead(t *testing.T, rt http.RoundTripper, url string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := get(t, ctx, rt, url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	cancel()
	b, err := io.ReadAll(resp.Body)
	return fmt.Sprintf("%q, %v", b, err)
}

// TestAdvEarlyBodyAfterCancel compares, with net/http, a body read after
// the request's context was canceled (a client gone while its proxy
// streams the response).
func TestAdvEarlyBodyAfterCancel(t *testing.T) {
	u := newTestUpstream(t)
	std := &http.Transport{DisableCompression: true}
	defer std.CloseIdleConnections()
	want := canceledRead(t, std, u.url("/cl"))
	t.Logf("net/http: %s", want)
	paths(t, func(tr *Transport) { tr.DisableCompression = true }, func(t *testing.T, rt http.RoundTripper, owner *member, _ func() http.RoundTripper) {
		warm(t, owner, u.url("/cl"))
		if got := canceledRead(t, rt, u.url("/cl")); got != want {
			t.Errorf("body read after cancel: %s; net/http: %s", got, want)
		}
	})
}
