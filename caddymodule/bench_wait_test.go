package caddymodule

import (
	"context"
	"net/http/httptrace"
	"net/textproto"
	"testing"
	"time"
)

// BenchmarkWaitGuard is the wait guard's cost for one request that has its
// connection at once: made over a context that carries a trace, as
// reverse_proxy's does, told that the head is out, and ended.
//
//	go test -run '^$' -bench WaitGuard -benchmem ./caddymodule/
func BenchmarkWaitGuard(b *testing.B) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	parent = httptrace.WithClientTrace(parent, &httptrace.ClientTrace{
		Got1xxResponse: func(int, textproto.MIMEHeader) error { return nil },
	})
	var waited countWaits
	b.ReportAllocs()
	for b.Loop() {
		g := newWaitGuard(parent, 5*time.Second, &waited, time.Now())
		g.WroteHeaders()
		g.end(true) // as the round trip returns
		g.cancel()
	}
}
