package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdv55ProbedBodyExpectContinue: a GET with a body of unknown length
// (net/http's Request.Write probes such a body before it writes the head)
// and Expect: 100-continue, to an HTTP/2 upstream that answers 100 at once
// and echoes the body. The local path (x/net/http2) writes the head, gets
// the 100 and sends the body (about 1ms). Through a sibling the
// caller's continueBody takes net/http's probe Read for the body's first
// read, fires Wait100Continue and waits for the 100 before the head has
// gone out: nothing reaches the owner, so no 100 can come, and the probe
// waits out its own 200ms timer before Request.Write sends the head. net/http's
// HTTP/1.1 client waits for the 100 only after the head (waitForContinue),
// and its probe reads the caller's body directly. Without Expect the
// sibling answers in about 1ms. The trace tells the order: the head
// (WroteHeaders) must come before the wait (Wait100Continue).
func TestAdv55ProbedBodyExpectContinue(t *testing.T) {
	owner, client, url := h2EchoPair(t, 2*time.Second)
	outs := map[string]h2Outcome{}
	orders := map[string][]string{}
	for _, name := range []string{"owner", "sibling"} {
		rt := map[string]http.RoundTripper{"owner": owner.tr, "sibling": client.tr}[name]
		var mu sync.Mutex
		var order []string
		note := func(ev string) func() {
			return func() { mu.Lock(); order = append(order, ev); mu.Unlock() }
		}
		trace := &httptrace.ClientTrace{WroteHeaders: note("head"), Wait100Continue: note("wait100")}
		ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/probe", io.NopCloser(strings.NewReader("hello")))
		req.Header.Set("Expect", "100-continue")
		outs[name] = roundTripOutcome(rt, req)
		cancel()
		mu.Lock()
		orders[name] = order
		mu.Unlock()
	}
	if o := outs["owner"]; o.status != 200 || o.body != "got hello" {
		t.Fatalf("reference changed: local %+v", o)
	}
	// The head goes out before any wait for the 100; waiting first costs
	// the probe's 200ms. The sibling's trace is the local path's: the
	// head, then the wait.
	if g := outs["sibling"]; g.status != 200 || g.body != "got hello" || g.duration >= 150*time.Millisecond || !slices.Equal(orders["sibling"], orders["owner"]) {
		t.Errorf("GET, body of unknown length, Expect: 100-continue: the sibling got status %d body %q error %q after %v (trace %v); the local path answered after %v (trace %v)",
			g.status, g.body, g.err, g.duration.Round(time.Millisecond), orders["sibling"], outs["owner"].duration.Round(time.Millisecond), orders["owner"])
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner: %+v", s)
	}
}

// TestProbedBodyExpectContinueHTTP1: the same request on orbit's local path to
// an HTTP/1.1 upstream goes as net/http's Transport sends it: the head, then
// the wait for the 100, then the body.
func TestProbedBodyExpectContinueHTTP1(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "got "+string(b))
	}))
	defer up.Close()
	ref := &http.Transport{ExpectContinueTimeout: 2 * time.Second}
	defer ref.CloseIdleConnections()
	local := localTransport(t, func(tr *Transport) { tr.ExpectContinueTimeout = 2 * time.Second })
	for name, rt := range map[string]http.RoundTripper{"net/http": ref, "orbit": local} {
		var mu sync.Mutex
		var order []string
		note := func(ev string) func() {
			return func() { mu.Lock(); order = append(order, ev); mu.Unlock() }
		}
		trace := &httptrace.ClientTrace{WroteHeaders: note("head"), Wait100Continue: note("wait100"), Got100Continue: note("got100")}
		ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.URL+"/probe", io.NopCloser(strings.NewReader("hello")))
		req.Header.Set("Expect", "100-continue")
		o := roundTripOutcome(rt, req)
		cancel()
		mu.Lock()
		got := strings.Join(order, ",")
		mu.Unlock()
		// The 100 may come before the writer says it waits for one.
		if o.status != 200 || o.body != "got hello" || (got != "head,wait100,got100" && got != "head,got100,wait100") {
			t.Errorf("%s: GET, body of unknown length, Expect: 100-continue: status %d body %q error %q after %v, trace %s; want the head first, then the wait and the 100",
				name, o.status, o.body, o.err, o.duration.Round(time.Millisecond), got)
		}
	}
}
