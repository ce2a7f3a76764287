package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestAdv75cEarlyAnswerThenReuse: POSTs whose upstream answers without
// reading the (large) body, alternated with GETs, through one sibling. Every
// answer is right, and whatever the early answer leaves on the stream is
// never taken by the pooled-stream peek for bytes nobody asked for (no such
// warning: a stream out of step is closed, not pooled).
func TestAdv75cEarlyAnswerThenReuse(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/early" {
			w.Header().Set("Connection", "keep-alive")
			w.WriteHeader(413)
			io.WriteString(w, "too big")
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok"+r.URL.Path)
	}))
	t.Cleanup(up.Close)
	owner, client, logs := adv75cPair(t, 0)
	warm(t, owner, up.URL+"/warm")
	for i := range 8 {
		got, err := adv75cDo(t, client, "POST", up.URL+"/early", strings.NewReader(strings.Repeat("z", 100<<10)), 10*time.Second)
		if err == nil && got != "too big" {
			t.Fatalf("%d: early answer %q", i, got)
		}
		got, err = adv75cDo(t, client, "GET", up.URL+"/g", nil, 10*time.Second)
		if err != nil || got != "ok/g" {
			t.Fatalf("%d: GET after an early answer: %q %v", i, got, err)
		}
	}
	if owner.node.Stats().ServedRemote < 16 {
		t.Fatalf("requests did not go through the sibling: %+v", owner.node.Stats())
	}
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "bytes nobody asked for") {
			t.Fatalf("stream after an early answer taken for stray bytes: %v", e.ContextMap())
		}
	}
}
