package orbitpool

import (
	"sync/atomic"
	"time"
)

// KeyStats is the fleet's state for one key, read from the table: gauges at
// the moment of reading and counters summed over every lane.
type KeyStats struct {
	Key Key
	// Gauges.
	Live     int // registered resources
	Held     int // units of a dead process's budget held back (Options.ReclaimHold)
	Creating int // creation permits outstanding
	Idle     int // live resources with no users or reservations
	Busy     int // live resources with at least one user or reservation
	InUse    int // accepted users
	Pending  int // reservations not yet accepted
	Waiting  int // goroutines parked on the key
	// Counters, since the key entry was last given to a key.
	Created      uint64        // resources registered through a permit
	ReusedLocal  uint64        // acquisitions served by the acquirer's own resource
	ReusedRemote uint64        // acquisitions served by a sibling's resource
	Accepted     uint64        // leases accepted by owners
	Aged         uint64        // reservations dropped unaccepted
	Waits        uint64        // acquisitions that waited and then succeeded
	Timeouts     uint64        // acquisitions whose context ended while waiting
	WaitTime     time.Duration // total time spent waiting, in Acquire and as Execution.CountWait adds
}

// LaneInfo describes one joined process.
type LaneInfo struct {
	Lane        int
	Local       bool // this process
	PID         int
	Incarnation Incarnation
	Started     time.Time
	Heartbeat   time.Time // last Reconcile: a hint, never a verdict
	Resources   int       // live resources the process owns
	Tag         uint64    // the process's Options.Tag
}

// Snapshot is the fleet's table as one process reads it.
type Snapshot struct {
	Spec  PoolSpec
	Lanes []LaneInfo
	Keys  []KeyStats
}

// Snapshot reads the whole table. It costs a scan of every slot: it is for
// metrics scrapes and the admin API, not for the request path.
func (p *Pool) Snapshot() (Snapshot, error) {
	if p.closed.Load() {
		return Snapshot{}, ErrClosed
	}
	s := p.seg
	snap := Snapshot{Spec: p.l.spec}
	// Lanes first: a reclaim frees a lane only after fixing the keys, so a
	// snapshot without a dead lane also has that lane's units back.
	for l := range p.l.nlanes {
		if lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) == laneLive {
			snap.Lanes = append(snap.Lanes, p.laneInfo(l))
		}
	}
	byIdx := map[int]int{}
	for k := range p.l.nkeys {
		off := s.keyOff(k)
		c := atomic.LoadUint64(s.u64(off + kfCtl))
		if kState(c) != keyLive {
			continue
		}
		ks := KeyStats{
			Key:      Key{atomic.LoadUint64(s.u64(off + kfHi)), atomic.LoadUint64(s.u64(off + kfLo))},
			Live:     kTotal(c) - kCreating(c),
			Creating: kCreating(c),
		}
		for l := range p.l.nlanes {
			so := s.statOff(l, k)
			ld := func(f int) uint64 { return atomic.LoadUint64(s.u64(so + f)) }
			ks.Created += ld(stCreated)
			ks.ReusedLocal += ld(stReusedLocal)
			ks.ReusedRemote += ld(stReusedRemote)
			ks.Accepted += ld(stAccepted)
			ks.Aged += ld(stAged)
			ks.Waits += ld(stWaits)
			ks.Timeouts += ld(stTimeouts)
			ks.WaitTime += time.Duration(ld(stWaitNanos))
			ks.Waiting += int(atomic.LoadUint32(s.u32(s.waitOff(l, k))))
		}
		byIdx[k] = len(snap.Keys)
		snap.Keys = append(snap.Keys, ks)
	}
	for i := range snap.Lanes {
		li := &snap.Lanes[i]
		for slot := range p.l.perLane {
			so := s.slotOff(li.Lane, slot)
			w := atomic.LoadUint64(s.u64(so + slWord))
			if wState(w) != StateLive {
				continue
			}
			held := p.isHeld(so)
			if !held {
				li.Resources++
			}
			k, _, ok := p.slotKey(so)
			i, known := byIdx[k]
			if !ok || !known {
				continue
			}
			ks := &snap.Keys[i]
			if held {
				ks.Held++
				continue
			}
			ks.InUse += wUse(w)
			ks.Pending += wPendN(w)
			if wUse(w)+wPendN(w) == 0 {
				ks.Idle++
			} else {
				ks.Busy++
			}
		}
	}
	// Held units are among the live ones the counters count, read before
	// the slots: a reclaim in between (whose units may have been creations
	// then) does not make the key look over its budget.
	for i := range snap.Keys {
		ks := &snap.Keys[i]
		ks.Held = min(ks.Held, ks.Live)
		ks.Live -= ks.Held
	}
	return snap, nil
}

// laneInfo reads lane l's record.
func (p *Pool) laneInfo(l int) LaneInfo {
	s := p.seg
	off := s.laneOff(l)
	return LaneInfo{
		Lane:        l,
		Local:       l == p.lane,
		PID:         int(atomic.LoadUint64(s.u64(off + lnPID))),
		Incarnation: Incarnation(atomic.LoadUint64(s.u64(off + lnIncarnation))),
		Started:     time.Unix(0, int64(atomic.LoadUint64(s.u64(off+lnStarted)))),
		Heartbeat:   time.Unix(0, int64(atomic.LoadUint64(s.u64(off+lnHeartbeat)))),
		Tag:         atomic.LoadUint64(s.u64(off + lnTag)),
	}
}
