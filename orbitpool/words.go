package orbitpool

import (
	"math/bits"
	"sync/atomic"
)

// A slot word packs everything Reserve, Accept and Complete decide on, so each
// of them is one compare-and-swap:
//
//	bits  0..7   pending reservations, one bit each
//	bits  8..23  accepted users
//	bits 24..27  State
//	bits 28..63  generation
const (
	pendMask  = 1<<PendingReservations - 1
	useShift  = 8
	useMask   = 1<<16 - 1
	useOne    = 1 << useShift
	stShift   = 24
	stMask    = 0xf
	wGenShift = 28
)

// slReturning, in the word of a free slot, says that its owner freed it
// (Unregister, or a creation permit's Close) and has not yet woken the key's
// waiters for the unit of budget that gives back: it is set by the
// compare-and-swap that frees the slot and cleared by one more after the
// wake-up. A process killed in between leaves it set, and the next recount
// wakes the key's waiters for the unit (see Pool.recount). A free slot has
// no users, so the bit (the top one of the users field) means nothing else
// there. When the owner takes the slot again for a creation before its
// wake-up is done, the mark moves to the lane's returning count for the key
// (segment.returningOff), which the goroutine that set it then decrements.
const slReturning = 1 << (useShift + 15)

func slotWord(gen uint64, st State, use int, pend uint64) uint64 {
	return gen<<wGenShift | uint64(st)<<stShift | uint64(use)<<useShift | pend
}
func wGen(w uint64) uint64  { return w >> wGenShift }
func wState(w uint64) State { return State(w >> stShift & stMask) }
func wUse(w uint64) int     { return int(w >> useShift & useMask) }
func wPend(w uint64) uint64 { return w & pendMask }
func wPendN(w uint64) int   { return bits.OnesCount64(w & pendMask) }
func nextGen(g uint64) uint64 { // generation 0 is never live, so a zero lease never matches
	g = (g + 1) & genMask
	if g == 0 {
		g = 1
	}
	return g
}

// Slot record offsets.
const (
	slWord     = 0
	slMeta     = 8  // key index (32) | key generation (24) << 32
	slCapacity = 16 // uint32
	slNext     = 20 // uint32: next slot of this lane's list for the key, plus one
	slCreated  = 24 // unix nanos, for reporting
	slTickets  = 64 // PendingReservations uint64
)

// A key's control word holds its budget counters, so ClaimCreate is one
// compare-and-swap that sees live and in-progress resources together:
//
//	bits  0..18  resources being created
//	bits 19..37  total resources (live + being created)
//	bits 38..39  entry state
//	bits 40..63  entry generation, bumped when the entry is reused for another key
const (
	kCreatingOne = 1
	kTotalShift  = 19
	kTotalOne    = 1 << kTotalShift
	kCountMask   = 1<<19 - 1
	kStShift     = 38
	kGenShift    = 40
	kGenMask     = 1<<24 - 1
)

const (
	keyEmpty = 0
	keyLive  = 1
	keyTomb  = 2
)

func kCreating(c uint64) int { return int(c & kCountMask) }
func kTotal(c uint64) int    { return int(c >> kTotalShift & kCountMask) }
func kState(c uint64) int    { return int(c >> kStShift & 3) }
func kGen(c uint64) uint32   { return uint32(c >> kGenShift & kGenMask) }
func kHead(c uint64) uint64  { return c >> kStShift } // state and generation
func keyCtl(gen uint32, st int) uint64 {
	return uint64(gen&kGenMask)<<kGenShift | uint64(st)<<kStShift
}

// Key record offsets.
const (
	kfCtl    = 0
	kfHi     = 8
	kfLo     = 16
	kfTicket = 24 // the last waiter ticket handed out for this key
	// kfMasks starts three masks of maskWords words each: lanes with
	// waiters, lanes that may have room, and lanes watching for room (see
	// WatchRoom).
	kfMasks = 32

	// kfUnclaimed counts units that came back while every waiter had a
	// unit on its way (see Pool.grant and waiterTable.eligible).
	kfUnclaimed = kfMasks + 3*MaxLanes/8
	// kfRoomSeq counts units that came back while a lane watched for room.
	kfRoomSeq = kfUnclaimed + 8
)

// A lane's queue word for one key is its part of the key's fleet-wide queue:
//
//	bits  0..15  grants: units handed to this lane's waiters, not yet delivered
//	bits 16..31  how many of its waiters are waiting (not yet granted), at most 0xffff
//	bits 32..63  the low half of the oldest waiting waiter's ticket
//
// The word after it holds the low halves of the second and third oldest
// waiting tickets. The lane writes both from its own queue (the second word
// first); a process returning capacity adds a grant to the lane whose next
// waiter to be granted is oldest (the oldest, the second or the third, by the
// grants already on their way; past the third, the third stands for it); the
// lane's dispatcher delivers grants to its oldest waiters. So a unit that
// comes back goes to the oldest waiter of the whole fleet, whichever process
// it is in, even when units come back faster than lanes deliver them.
//
// The third word names the oldest of the lane's waiters that were delivered a
// grant and have not yet taken it (bit 32 set, the ticket's low half below;
// bit 32 clear when there is none). Such a waiter is in neither count of the
// first word, yet a unit is on its way to it: a younger waiter of another lane
// that re-checks meanwhile must leave that unit to it (see eligible). Bits
// 33..63 count the word's stores, so that a reader that reads it before and
// after the first word can tell whether it read one state.
const (
	queueSize     = 24
	qHeldOff      = 16
	qHeldValid    = 1 << 32
	qHeldVerShift = 33
	qGrantMask    = 1<<16 - 1
	qUngShift     = 16
	qTickShift    = 32
)

func qGrants(q uint64) int          { return int(q & qGrantMask) }
func qWaiting(q uint64) int         { return int(q >> qUngShift & 0xffff) }
func qTicket(q uint64) uint32       { return uint32(q >> qTickShift) }
func heldWord(ticket uint64) uint64 { return qHeldValid | uint64(uint32(ticket)) }

// olderHeld is whichever of two held words names the older ticket, without
// its count of stores.
func olderHeld(a, b uint64) uint64 {
	a, b = a&(1<<qHeldVerShift-1), b&(1<<qHeldVerShift-1)
	if a&qHeldValid == 0 || b&qHeldValid != 0 && ticketBefore(uint32(b), uint32(a)) {
		return b
	}
	return a
}

// storeHeld stores h, a held word without its count, into the held word at w,
// counting the store. Only the lane's own process stores it, under its
// waiter table's lock.
func storeHeld(w *uint64, h uint64) {
	n := atomic.LoadUint64(w)>>qHeldVerShift + 1
	atomic.StoreUint64(w, n<<qHeldVerShift|h)
}

// laneOrder is laneNext, with the held word of the same state: it is read
// before and after the queue words, again while a store came between, and a
// waiter still moving after a few tries counts as held if either read names
// it.
func (s *segment) laneOrder(l, k int) (next uint32, q uint64, ok bool, held uint64) {
	hw := s.u64(s.queueOff(l, k) + qHeldOff)
	for try := 0; ; try++ {
		held = atomic.LoadUint64(hw)
		next, q, ok = s.laneNext(l, k)
		if h := atomic.LoadUint64(hw); h != held {
			if try < 3 {
				continue
			}
			held = olderHeld(held, h)
		}
		return next, q, ok, held
	}
}

func queueWord(ticket uint64, waiting int) uint64 {
	return uint64(uint32(ticket))<<qTickShift | uint64(min(waiting, 0xffff))<<qUngShift
}

// laneNext reads lane l's queue words for key k and returns the ticket of the
// waiter the lane would deliver its next grant to, and the first word; ok is
// false when every waiting waiter of the lane has a grant on its way.
func (s *segment) laneNext(l, k int) (next uint32, q uint64, ok bool) {
	off := s.queueOff(l, k)
	q = atomic.LoadUint64(s.u64(off))
	g := qGrants(q)
	if qWaiting(q) <= g {
		return 0, q, false
	}
	if g == 0 {
		return qTicket(q), q, true
	}
	more := atomic.LoadUint64(s.u64(off + 8))
	if g == 1 {
		return uint32(more), q, true
	}
	return uint32(more >> 32), q, true
}

// ticketBefore reports whether ticket a was handed out before b. Tickets are
// compared in 32 bits, which holds while no waiter waits through 2^31 others.
func ticketBefore(a, b uint32) bool { return int32(a-b) < 0 }

// maskOff, roomOff and watchOff address the word of key k's waiter, room
// and watch masks that holds lane l's bit.
func (s *segment) maskOff(k, l int) int { return s.keyOff(k) + kfMasks + 8*(l>>6) }
func (s *segment) roomOff(k, l int) int {
	return s.keyOff(k) + kfMasks + 8*(s.l.maskWords+l>>6)
}
func (s *segment) watchOff(k, l int) int {
	return s.keyOff(k) + kfMasks + 8*(2*s.l.maskWords+l>>6)
}
func laneBit(l int) uint64 { return 1 << (l & 63) }

// Lane record offsets.
const (
	lnCtl         = 0 // generation (32) << 8 | state
	lnIncarnation = 8
	lnPID         = 16
	lnStarted     = 24
	lnHeartbeat   = 32
	lnDoorbell    = 40 // uint32 futex word
	lnSleeping    = 44 // uint32: the dispatcher is (about to be) in futex wait
	lnTag         = 48 // the member's Options.Tag
)

const (
	laneFree = 0
	laneLive = 1
)

func lnState(c uint64) int              { return int(c & 0xff) }
func lnGen(c uint64) uint32             { return uint32(c >> 8) }
func laneCtl(gen uint32, st int) uint64 { return uint64(gen)<<8 | uint64(st) }

// Per-lane, per-key counters.
const (
	stCreated = iota * 8
	stReusedLocal
	stReusedRemote
	stWaits
	stWaitNanos
	stTimeouts
	stAccepted
	stAged
)

// A ticket names one reservation: the reserving lane, the low bits of that
// lane's generation, and a counter. The owner drops reservations whose lane
// life has ended without waiting for them to age. A ticket with claimFlag set
// in its counter is a claim (see Pool.claim): it names the process accepting
// or withdrawing the reservation that was in its place, not a reservation.
func makeTicket(lane int, laneGen uint32, n uint32) uint64 {
	return uint64(lane)<<56 | uint64(laneGen&0xffffff)<<32 | uint64(n)
}
func ticketLane(t uint64) int       { return int(t >> 56) }
func ticketLaneGen(t uint64) uint32 { return uint32(t>>32) & 0xffffff }
func isClaim(t uint64) bool         { return t&claimFlag != 0 }

const claimFlag = 1 << 31

// Typed accessors. Offsets are computed only from indices already checked
// against the layout.

func (s *segment) slotOff(lane, slot int) int {
	return s.l.slots + (lane*s.l.perLane+slot)*slotSize
}
func (s *segment) keyOff(k int) int      { return s.l.keys + k*keySize }
func (s *segment) laneOff(l int) int     { return s.l.lanes + l*laneSize }
func (s *segment) headOff(l, k int) int  { return s.l.heads + (l*s.l.nkeys+k)*4 }
func (s *segment) waitOff(l, k int) int  { return s.l.waits + (l*s.l.nkeys+k)*4 }
func (s *segment) queueOff(l, k int) int { return s.l.queues + (l*s.l.nkeys+k)*queueSize }
func (s *segment) statOff(l, k int) int  { return s.l.stats + (l*s.l.nkeys+k)*statSize }
func (s *segment) returningOff(l, k int) int {
	return s.l.returning + (l*s.l.nkeys+k)*4
}

// capacity reads the capacity of the slot at off, at most MaxCapacity: more
// (a corrupt word) would let users carry out of the slot word's users field
// into its state.
func (s *segment) capacity(off int) int {
	return min(int(atomic.LoadUint32(s.u32(off+slCapacity))), MaxCapacity)
}

func (s *segment) count(l, k, field int, n uint64) {
	atomic.AddUint64(s.u64(s.statOff(l, k)+field), n)
}

func trailingZeros(x uint64) int { return bits.TrailingZeros64(x) }
