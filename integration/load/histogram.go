package load

import (
	"math/bits"
	"time"
)

// histogram records latencies in log-linear buckets: 64 per power of two,
// so any percentile it reports is within about 1.6% of the true value, in
// constant memory however long the run.
type histogram struct {
	counts [64 * 64]uint64
	n      uint64
	max    time.Duration
}

const subBits = 6

func bucketOf(d time.Duration) int {
	v := uint64(max(d, 0))
	if v < 1<<subBits {
		return int(v)
	}
	exp := bits.Len64(v) - subBits - 1
	return (exp+1)<<subBits | int(v>>exp)&(1<<subBits-1)
}

// lowerBound is the smallest duration that falls in bucket b.
func lowerBound(b int) time.Duration {
	exp, sub := b>>subBits, uint64(b&(1<<subBits-1))
	if exp == 0 {
		return time.Duration(sub)
	}
	return time.Duration((1<<subBits | sub) << (exp - 1))
}

func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(d)]++
	h.n++
	h.max = max(h.max, d)
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile is the latency below which a fraction q of the samples fall.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n-1)) + 1
	var seen uint64
	for b, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(lowerBound(b), h.max)
		}
	}
	return h.max
}
