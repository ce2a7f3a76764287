package orbitpool

import (
	"fmt"
	"sync/atomic"
)

// testHookGrant, set only by tests, runs in Reserve and in a local use
// between their read of the capacity and the compare-and-swap that grants:
// the window that the re-check in overCapacity closes. Tests put a
// SetCapacity (of this process or another) in it to make the interleaving
// certain rather than rare.
var testHookGrant atomic.Pointer[func(ResourceID)]

func grantHook(id ResourceID) {
	if h := testHookGrant.Load(); h != nil {
		(*h)(id)
	}
}

// testHookClaimed, set only by tests, runs in Accept and in a withdrawal
// between the claim of a reservation's ticket and the use or release of its
// bit: a claimer held up there, as a descheduled process may be for longer
// than ReservationTimeout.
var testHookClaimed atomic.Pointer[func()]

// testHookBudgetLost, set only by tests, runs in Acquire after a creation
// claim lost the key's budget and before the budget is read again: a
// sibling's creation that completes there is not among the candidates the
// policy decides on next.
var testHookBudgetLost atomic.Pointer[func()]

func budgetLostHook() {
	if h := testHookBudgetLost.Load(); h != nil {
		(*h)()
	}
}

// SetCapacity changes how many concurrent users a live resource this process
// owns admits: for instance an HTTP/2 connection whose peer changed its
// SETTINGS_MAX_CONCURRENT_STREAMS. Capacity 0 drains the resource: it stays
// registered, and counted against its key's budget, but takes no new
// reservation until its capacity is raised again or it is unregistered.
//
// Lowering never takes anything back: accepted executions and reservations
// already granted run to their end. It bounds what is granted after it: every
// Reserve or local use whose compare-and-swap comes after SetCapacity returns
// is granted only if the resource's users and pending reservations, counting
// it, stay within the new capacity. Raising wakes waiters on the key for the
// units it adds.
func (p *Pool) SetCapacity(id ResourceID, capacity int) error {
	if capacity < 0 || capacity > MaxCapacity {
		return fmt.Errorf("orbitpool: capacity %d out of range [0, %d]", capacity, MaxCapacity)
	}
	off, err := p.ownSlot(id)
	if err != nil {
		return err
	}
	s := p.seg
	// laneMu orders this with Unregister and with the creation of a new
	// life in the slot, the only other writers of the capacity word: the
	// generation checked here is the one whose capacity is written.
	p.laneMu.Lock()
	w := atomic.LoadUint64(s.u64(off + slWord))
	if wGen(w) != id.Generation() || wState(w) != StateLive {
		p.laneMu.Unlock()
		return fmt.Errorf("orbitpool: set capacity of %v: %w", id, ErrStale)
	}
	old := int(atomic.SwapUint32(s.u32(off+slCapacity), uint32(capacity)))
	k, _, ok := p.slotKey(off)
	p.laneMu.Unlock()
	if !ok {
		return fmt.Errorf("orbitpool: resource %v names key entry %d: %w", id, k, ErrCorrupt)
	}
	if capacity > old {
		p.setRoom(p.lane, k, true)
		p.wake(k, uint64(capacity-old))
	}
	return nil
}

// Capacity reports the capacity of a live resource, as last set by Register
// or SetCapacity.
func (p *Pool) Capacity(id ResourceID) (int, error) {
	lane, slot := id.Lane(), id.Slot()
	if lane >= p.l.nlanes || slot >= p.l.perLane {
		return 0, fmt.Errorf("orbitpool: capacity of %v: no such slot: %w", id, ErrStale)
	}
	s := p.seg
	off := s.slotOff(lane, slot)
	w := atomic.LoadUint64(s.u64(off + slWord))
	c := s.capacity(off)
	w2 := atomic.LoadUint64(s.u64(off + slWord))
	if wGen(w) != id.Generation() || wGen(w2) != wGen(w) || wState(w2) != StateLive {
		return 0, fmt.Errorf("orbitpool: capacity of %v: %w", id, ErrStale)
	}
	return c, nil
}

// Users reports how many users a live resource has, its reservations still
// pending included. Once SetCapacity has taken its capacity to 0, no more
// come (one that raced the change gives its use back): a caller that did so
// learns whether anyone still holds the resource.
func (p *Pool) Users(id ResourceID) (int, error) {
	lane, slot := id.Lane(), id.Slot()
	if lane >= p.l.nlanes || slot >= p.l.perLane {
		return 0, fmt.Errorf("orbitpool: users of %v: no such slot: %w", id, ErrStale)
	}
	w := atomic.LoadUint64(p.seg.u64(p.seg.slotOff(lane, slot) + slWord))
	if wGen(w) != id.Generation() || wState(w) != StateLive {
		return 0, fmt.Errorf("orbitpool: users of %v: %w", id, ErrStale)
	}
	return wUse(w) + wPendN(w), nil
}

// overCapacity is the check a grant makes after its compare-and-swap: w is
// the slot word the grant installed, counting it. The capacity read before
// the compare-and-swap may predate a SetCapacity that lowered it; the one
// read now cannot, for the swap came after the store. A grant over the
// capacity it reads now is given back by its caller. Concurrent grants may
// each see the others' and all give back: a spurious ErrBusy, never an
// excess.
func (p *Pool) overCapacity(off int, w uint64) bool {
	return wUse(w)+wPendN(w) > p.seg.capacity(off)
}

// ungrant gives back a reservation on id that overCapacity refused, or that
// its reserver withdraws (dropClaimed), unless the slot was freed meanwhile
// or its owner aged the reservation. A closed pool leaves its reservations
// to their owners, which drop them as those of a life that ended. It marks
// the owner's lane as having room, since a scan may have cleared it while
// the reservation filled the resource, and wakes the key for the unit a
// waiter may have been refused because of it.
func (p *Pool) ungrant(off int, id ResourceID, bit int, ticket uint64) {
	p.withdrawing.RLock()
	dropped := !p.closed.Load() && p.dropClaimed(off, bit, ticket, id.Generation())
	p.withdrawing.RUnlock()
	if !dropped {
		return
	}
	if k, _, ok := p.slotKey(off); ok {
		p.setRoom(id.Lane(), k, false)
		p.wake(k, 1)
	}
}

// Withdraw gives back a reservation whose lease its owner has not accepted,
// for a reserver that could not deliver it (a stream the owner had closed,
// a deadline that passed first): without it the unit stays held until the
// owner ages the reservation out (Options.ReservationTimeout), and the
// resource has no room for anyone meanwhile. A lease the owner accepted or
// aged out has no ticket left, and is left alone, so a reserver that cannot
// tell may always withdraw.
func (p *Pool) Withdraw(l Lease) {
	lane, slot := l.ID.Lane(), l.ID.Slot()
	if lane >= p.l.nlanes || slot >= p.l.perLane || l.Bit >= PendingReservations || l.Ticket == 0 || isClaim(l.Ticket) {
		return
	}
	p.ungrant(p.seg.slotOff(lane, slot), l.ID, int(l.Bit), l.Ticket)
}
