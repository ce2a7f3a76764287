//go:build orbithopclock

package proxy

import (
	"slices"
	"sync"
	"time"
)

// The hop clock times the stages of remote exchanges run one at a time
// (BenchmarkRemoteAddedLatency with -tags orbithopclock): each mark records
// the time since the previous one under the stage it ends. Exchanges that
// overlap mix their stages; the numbers are then meaningless.
var hopClock struct {
	mu    sync.Mutex
	last  time.Time
	spans [numHopStages][]time.Duration
}

func hopMark(s hopStage) {
	now := time.Now()
	hopClock.mu.Lock()
	if s != hopStart {
		hopClock.spans[s] = append(hopClock.spans[s], now.Sub(hopClock.last))
	}
	hopClock.last = now
	hopClock.mu.Unlock()
}

// hopStageMedians returns each stage's median since the last call, in µs,
// and starts over.
func hopStageMedians() map[string]float64 {
	hopClock.mu.Lock()
	defer hopClock.mu.Unlock()
	m := make(map[string]float64)
	for s := hopStage(1); s < numHopStages; s++ {
		d := hopClock.spans[s]
		if len(d) == 0 {
			continue
		}
		slices.Sort(d)
		m[hopStageNames[s]] = float64(d[len(d)/2].Nanoseconds()) / 1e3
		hopClock.spans[s] = nil
	}
	return m
}
