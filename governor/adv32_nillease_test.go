package governor

import (
	"context"
	"testing"
)

// TestAdv32WithNilLease: a nil *LeaseSet is a lease callers pass around
// (Release on it does nothing, and the proxy's owner has one when it runs
// without a governor), so a context made with WithLease(ctx, nil) must act
// as one carrying no lease, not panic in AcquireManyContext.
func TestAdv32WithNilLease(t *testing.T) {
	g := New(2, 0)
	var ls *LeaseSet
	var got *LeaseSet
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("AcquireManyContext under WithLease(ctx, nil) panicked: %v", p)
			}
		}()
		got, err = g.AcquireManyContext(WithLease(context.Background(), ls), 1, 0)
	}()
	if err != nil || got.Workers() != 1 || g.Outstanding() != 1 {
		t.Fatalf("got %v, %v with %d outstanding; want a lease of one worker", got, err, g.Outstanding())
	}
	got.Release()
	if g.Outstanding() != 0 {
		t.Fatalf("%d outstanding after Release", g.Outstanding())
	}
}
