// Package backpressure turns a request's deadline into an early, clear
// refusal instead of a late timeout.
//
// A [Limiter] hands out [Permit]s from a pool shared by all its clones, so
// the cap is process-wide while each clone carries the deadline of the
// request it serves. An acquire that cannot be useful is refused at once:
// past the deadline, within the near-window before it (in-flight work
// finishes, nothing new starts), or while the pool is drained. Otherwise it
// waits for a permit, in arrival order, until the deadline comes near.
// [RefusalFor] maps each refusal to what an HTTP proxy should answer.
//
// # Benchmarks
//
// The hot path is a single compare-and-swap on one word, and an atomic add
// that hands out a Permit from a batch (see [Permit] for why batches); a mutex
// and a FIFO wait list are used only when no permit is free. The benchmarks
// compare an Acquire/Release pair against the same pair on
// golang.org/x/sync/semaphore, uncontended and with b.RunParallel on the
// available cores (with headroom, and saturated so that goroutines queue and
// are handed permits in order):
//
//	go test -run '^$' -bench . -benchmem -count 5 ./backpressure/
package backpressure
