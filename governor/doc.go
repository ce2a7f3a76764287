// Package governor is the process's single budget of workers and memory, and
// the admission backstop against pathological fan-out.
//
// A proxy process does bursts of forwarding work whose parallelism nests: a
// forwarded exchange may relay several streams, and each stream may want its
// own buffers. If each layer were handed a thread count of its own, the
// product of the layers would be unbounded. Instead every layer draws a
// [LeaseSet] from one [Governor], so the total can never exceed the budget.
//
// Two rules keep the budget deadlock-free. A unit of work takes its whole
// allocation in one call ([Governor.AcquireMany]) and never waits for more
// while holding it; and a grant is never smaller than one worker, because a
// single over-budget worker is better than no progress. Code that runs under
// a lease and wants extra helpers passes the lease down in its context
// ([WithLease]); an acquire made under it never waits, so nesting cannot
// deadlock.
//
// In orbit's proxy the Governor is the process's budget for exchange work:
// every exchange, the process's own and each it forwards for a sibling,
// holds a worker and its buffers' memory while it runs, and a large body
// asks for several buffers with [Governor.AcquireManyContext] and streams
// with fewer when memory is short.
//
// [Admission] is a different, deliberately blunt tool: a never-blocking
// ceiling on how many things a caller runs at once. It exists so that a
// runaway fan-out cannot exhaust file handles or goroutines; it is set far
// above any width ordinary traffic produces and is not meant to schedule.
//
// # Benchmarks
//
// The hot path (one worker, no memory) is a single compare-and-swap on one
// word, and an atomic add that hands out a LeaseSet from a batch (see
// [LeaseSet] for why batches); a mutex and a FIFO wait list are used only when
// bytes are charged or no worker is free. The benchmarks compare an
// Acquire/Release pair against the same pair on golang.org/x/sync/semaphore,
// uncontended and with b.RunParallel on the available cores (with headroom,
// and saturated so that goroutines queue and are handed workers in order):
//
//	go test -run '^$' -bench . -benchmem -count 5 ./governor/
package governor
