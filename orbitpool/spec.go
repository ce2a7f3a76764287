package orbitpool

import (
	"fmt"
	"path/filepath"
)

const (
	// PendingReservations is how many unaccepted reservations one resource can
	// hold at once. It is part of the slot ABI, not a tunable: an owner that is
	// this far behind is the problem, not the table.
	PendingReservations = 8

	// DefaultKeyCapacity is how many distinct keys a segment names at once in
	// the default spec.
	DefaultKeyCapacity = 1024

	// DefaultResourcesPerLane is how many resources one process can have
	// registered at once in the default spec.
	DefaultResourcesPerLane = 1024

	// DefaultLanes is how many processes the default spec admits at once,
	// counting old and new processes overlapping during an upgrade.
	DefaultLanes = 64

	// MaxLanes is the most lanes a segment can have (the lane field of a
	// ResourceID). A key's masks of lanes take one 64-bit word per 64 lanes.
	MaxLanes = 256

	// MaxResourcesPerLane is the most slots a lane can have (the slot field of
	// a ResourceID).
	MaxResourcesPerLane = 1<<slotBits - 1

	// MaxCapacity is the most concurrent users one resource can admit.
	MaxCapacity = 1<<16 - 1

	// PoolKind tags segments holding this pool table, so that a file of
	// another kind of segment is refused rather than misread.
	PoolKind uint32 = 0x4f50_0001

	// DefaultSegmentName is the file name of the default segment under
	// /dev/shm.
	DefaultSegmentName = "orbit-pool"
)

// DefaultSegmentPath is where a fleet's segment lives unless configured.
var DefaultSegmentPath = filepath.Join("/dev/shm", DefaultSegmentName)

// PoolSpec says which segment a pool uses and how big its tables are. Every
// process of a fleet must open the segment with the same spec.
type PoolSpec struct {
	// Path is the segment file. Empty means process memory: a standalone
	// pool that no other process can see.
	Path string
	// Kind tags the segment's contents. Default PoolKind.
	Kind uint32
	// Lanes is how many processes can be joined at once. Default
	// DefaultLanes, at most MaxLanes.
	Lanes int
	// Keys is how many distinct keys can be named at once. Default
	// DefaultKeyCapacity.
	Keys int
	// ResourcesPerLane is how many resources one process can hold at once.
	// Default DefaultResourcesPerLane.
	ResourcesPerLane int
	// Protocol is the version of what the fleet's processes say to each
	// other outside the segment (the proxy's unix leg). A process of
	// another protocol cannot join: it could share the table but not the
	// resources. Default 0.
	Protocol uint32
}

// WithDefaults returns the spec with zero fields set to their defaults.
func (s PoolSpec) WithDefaults() PoolSpec {
	if s.Kind == 0 {
		s.Kind = PoolKind
	}
	if s.Lanes == 0 {
		s.Lanes = DefaultLanes
	}
	if s.Keys == 0 {
		s.Keys = DefaultKeyCapacity
	}
	if s.ResourcesPerLane == 0 {
		s.ResourcesPerLane = DefaultResourcesPerLane
	}
	return s
}

// Validate reports a spec that cannot be laid out.
func (s PoolSpec) Validate() error {
	switch {
	case s.Lanes < 1 || s.Lanes > MaxLanes:
		return fmt.Errorf("orbitpool: lanes %d out of range [1, %d]", s.Lanes, MaxLanes)
	case s.Keys < 1 || s.Keys > 1<<20:
		return fmt.Errorf("orbitpool: keys %d out of range [1, %d]", s.Keys, 1<<20)
	case s.ResourcesPerLane < 1 || s.ResourcesPerLane > MaxResourcesPerLane:
		return fmt.Errorf("orbitpool: resources per lane %d out of range [1, %d]", s.ResourcesPerLane, MaxResourcesPerLane)
	}
	return nil
}

// SegmentSize is the number of bytes the segment for spec needs, after
// defaults are applied. It is the size of the file an operator must have room
// for under /dev/shm.
func SegmentSize(spec PoolSpec) int64 {
	return int64(newLayout(spec.WithDefaults()).size)
}

// Sizes of the segment's records. Each record starts on a cache line, so that
// two processes hammering neighbouring records do not share a line.
const (
	headerSize = 4096
	laneSize   = 128
	keySize    = 192
	statSize   = 64
	slotSize   = 128
)

// layout gives the offset of every table in the segment.
type layout struct {
	spec      PoolSpec
	lanes     int // offset of the lane table
	keys      int // offset of the key table
	index     int // nindex uint64: the hash index over the key table
	heads     int // lanes × keys uint32: head of each lane's list for a key
	waits     int // lanes × keys uint32: each lane's waiter count for a key
	queues    int // lanes × keys queueSize: each lane's part of a key's queue
	stats     int // lanes × keys statSize: each lane's counters for a key
	returning int // lanes × keys uint32: units a lane gives back to a key and has not yet woken its waiters for (see slReturning)
	slots     int // lanes × resourcesPerLane slotSize
	size      int
	nlanes    int
	nkeys     int
	nindex    int // a power of two, at least 4 × nkeys
	perLane   int
	maskWords int // words in each of a key's lane masks
	nslots    int
	laneSlot  int // first slot of lane l is laneSlot*l
}

func align(n, to int) int { return (n + to - 1) / to * to }

func newLayout(s PoolSpec) layout {
	l := layout{spec: s, nlanes: s.Lanes, nkeys: s.Keys, perLane: s.ResourcesPerLane, maskWords: (s.Lanes + 63) / 64}
	off := headerSize
	l.lanes = off
	off += s.Lanes * laneSize
	l.keys = align(off, 64)
	off = l.keys + s.Keys*keySize
	l.nindex = indexSize(s.Keys)
	l.index = align(off, 64)
	off = l.index + l.nindex*8
	l.heads = align(off, 64)
	off = l.heads + s.Lanes*s.Keys*4
	l.waits = align(off, 64)
	off = l.waits + s.Lanes*s.Keys*4
	l.queues = align(off, 64)
	off = l.queues + s.Lanes*s.Keys*queueSize
	l.stats = align(off, 64)
	off = l.stats + s.Lanes*s.Keys*statSize
	l.returning = align(off, 64)
	off = l.returning + s.Lanes*s.Keys*4
	l.slots = align(off, 4096)
	l.nslots = s.Lanes * s.ResourcesPerLane
	off = l.slots + l.nslots*slotSize
	l.size = align(off, 4096)
	l.laneSlot = s.ResourcesPerLane
	return l
}
