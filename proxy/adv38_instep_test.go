package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAdv38LargeHeadsAndShortBodiesInStep: a sibling's requests with heads
// from none to well past the owner's read buffer (and past maxHeadAhead),
// each with short bodies at and around the buffer's size, go one after
// another on the owner's connection: each reaches the upstream whole, and
// the stream stays in step for the next.
func TestAdv38LargeHeadsAndShortBodiesInStep(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(500)
			return
		}
		fmt.Fprintf(w, "%d %d %x", len(r.Header.Get("Cookie")), len(b), b[len(b)/2:min(len(b), len(b)/2+8)])
	}))
	defer up.Close()
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
	owner := newMember(t, spec, conf)
	client := newMember(t, spec, conf)
	if err := getBody(context.Background(), owner.tr, up.URL+"/warm"); err != nil {
		t.Fatal(err)
	}
	before := owner.node.Stats().ServedRemote
	n := 0
	for _, cookie := range []int{0, 1500, 4000, 4090, 5000, 9000, 70 << 10} {
		for _, body := range []int{1, 2000, maxBodyWithHead - 1, maxBodyWithHead, maxBodyWithHead + 1} {
			b := bytes.Repeat([]byte{byte('a' + n%26)}, body)
			for i := range b {
				b[i] += byte(i % 3)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			req, _ := http.NewRequestWithContext(ctx, "POST", up.URL+"/echo", bytes.NewReader(b))
			if cookie > 0 {
				req.Header.Set("Cookie", strings.Repeat("c", cookie))
			}
			resp, err := client.tr.RoundTrip(req)
			if err != nil {
				cancel()
				t.Fatalf("cookie %d body %d: %v", cookie, body, err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			cancel()
			want := fmt.Sprintf("%d %d %x", cookie, body, b[body/2:min(body, body/2+8)])
			if err != nil || string(got) != want {
				t.Fatalf("cookie %d body %d: got %q (%v), want %q", cookie, body, got, err, want)
			}
			n++
		}
	}
	if served := owner.node.Stats().ServedRemote - before; served != uint64(n) {
		t.Fatalf("the owner served %d of the sibling's %d requests, want all", served, n)
	}
}
