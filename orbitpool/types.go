package orbitpool

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Errors returned by the pool. Match them with errors.Is: more causes may be
// added, so callers handle the ones they know and treat the rest as failures.
var (
	// ErrBusy means the resource has no room for another reservation now.
	ErrBusy = errors.New("orbitpool: resource busy")
	// ErrStale means a lease or id no longer names a live resource: the slot
	// was freed or reused, the owner is gone, or the reservation was aged out.
	ErrStale = errors.New("orbitpool: stale lease or resource")
	// ErrNotOwner means an owner-only operation named another lane's resource.
	ErrNotOwner = errors.New("orbitpool: resource belongs to another lane")
	// ErrClosed means the pool was closed.
	ErrClosed = errors.New("orbitpool: pool closed")
	// ErrFull means a table (lanes, keys or this lane's resource slots) has no
	// free entry.
	ErrFull = errors.New("orbitpool: table full")
	// ErrBudget means the key's creation budget has no room.
	ErrBudget = errors.New("orbitpool: creation budget exhausted")
	// ErrCorrupt means the segment holds something no correct process wrote.
	ErrCorrupt = errors.New("orbitpool: corrupt segment")
	// ErrIncompatible means the segment was made with another ABI version or
	// spec than the one asked for.
	ErrIncompatible = errors.New("orbitpool: incompatible segment")
	// ErrRefused means the policy declined to serve the request.
	ErrRefused = errors.New("orbitpool: refused by policy")
	// ErrLeakedGuard is reported through Options.OnError when an Execution
	// or CreationPermit was garbage-collected without being released, and
	// its unit was returned then: a bug in the caller.
	ErrLeakedGuard = errors.New("orbitpool: guard garbage-collected without release")
)

// Key is what a resource is usable for: a 128-bit digest, computed by the
// caller, of everything that forbids reuse across contexts. The pool never
// hashes; two resources with equal keys are interchangeable by the caller's own
// definition. The zero Key is valid.
type Key struct{ Hi, Lo uint64 }

func (k Key) String() string { return fmt.Sprintf("%016x%016x", k.Hi, k.Lo) }

// Incarnation identifies one life of a process. A lane reused by a new process
// gets a new incarnation, so leases addressed to the old one are refused.
type Incarnation uint64

// ResourceID addresses one resource: the owner's lane, the slot within that
// lane, and the slot's generation. It is plain data and crosses processes.
//
// Bit layout: lane (8) | slot (20) | generation (36).
type ResourceID uint64

const (
	genBits  = 36
	slotBits = 20
	laneBits = 8
	genMask  = 1<<genBits - 1
	slotMask = 1<<slotBits - 1
)

func makeID(lane, slot int, gen uint64) ResourceID {
	return ResourceID(uint64(lane)<<(slotBits+genBits) | uint64(slot)<<genBits | gen&genMask)
}

// Lane is the index of the owner's lane.
func (id ResourceID) Lane() int { return int(uint64(id) >> (slotBits + genBits)) }

// Slot is the index of the resource within its owner's lane.
func (id ResourceID) Slot() int { return int(uint64(id)>>genBits) & slotMask }

// Generation distinguishes successive uses of one slot.
func (id ResourceID) Generation() uint64 { return uint64(id) & genMask }

func (id ResourceID) String() string {
	return fmt.Sprintf("%d/%d#%d", id.Lane(), id.Slot(), id.Generation())
}

// Lease is reserved capacity on one resource: the right to ask its owner to use
// it. It is plain data that crosses processes as [LeaseSize] bytes; the owner
// validates it against the slot in [Pool.Accept].
type Lease struct {
	// ID is the reserved resource.
	ID ResourceID
	// Owner is the incarnation of the owning process when the lease was taken.
	Owner Incarnation
	// Ticket is unique to this reservation among the slot's pending ones; it
	// names the reserving lane and life so that the owner can drop
	// reservations of a process that died before sending its lease.
	Ticket uint64
	// Bit is the reservation's position among the slot's pending reservations.
	Bit uint8
}

// LeaseSize is the length of an encoded Lease.
const LeaseSize = 32

const leaseVersion = 1

// AppendBinary appends the lease's wire form to b.
func (l Lease) AppendBinary(b []byte) ([]byte, error) {
	var buf [LeaseSize]byte
	buf[0] = leaseVersion
	buf[1] = l.Bit
	binary.LittleEndian.PutUint64(buf[8:], uint64(l.ID))
	binary.LittleEndian.PutUint64(buf[16:], uint64(l.Owner))
	binary.LittleEndian.PutUint64(buf[24:], l.Ticket)
	return append(b, buf[:]...), nil
}

// MarshalBinary returns the lease's wire form.
func (l Lease) MarshalBinary() ([]byte, error) { return l.AppendBinary(make([]byte, 0, LeaseSize)) }

// UnmarshalBinary decodes a lease, rejecting anything AppendBinary cannot
// produce. It checks form only; whether the lease is current is for Accept.
func (l *Lease) UnmarshalBinary(b []byte) error {
	if len(b) != LeaseSize {
		return fmt.Errorf("orbitpool: lease is %d bytes, want %d", len(b), LeaseSize)
	}
	if b[0] != leaseVersion {
		return fmt.Errorf("orbitpool: lease version %d, want %d", b[0], leaseVersion)
	}
	for _, c := range b[2:8] {
		if c != 0 {
			return errors.New("orbitpool: lease has nonzero reserved bytes")
		}
	}
	if b[1] >= PendingReservations {
		return fmt.Errorf("orbitpool: lease reservation bit %d out of range", b[1])
	}
	id := ResourceID(binary.LittleEndian.Uint64(b[8:]))
	if id.Generation() == 0 {
		return errors.New("orbitpool: lease names generation 0")
	}
	ticket := binary.LittleEndian.Uint64(b[24:])
	if ticket == 0 {
		return errors.New("orbitpool: lease has no ticket")
	}
	*l = Lease{ID: id, Owner: Incarnation(binary.LittleEndian.Uint64(b[16:])), Ticket: ticket, Bit: b[1]}
	return nil
}

// Limits bounds one acquisition. Zero fields are unlimited.
type Limits struct {
	// MaxResources caps the key's live plus in-progress resources across the
	// fleet: its creation budget.
	MaxResources int
	// MaxCreating caps how many of those may be in progress at once, so a
	// cold key is warmed gradually rather than stampeded.
	MaxCreating int
}

// State is where a resource stands, as read from the table: a snapshot, never
// a reservation.
type State uint8

// Resource states.
const (
	StateFree     State = iota // slot unused
	StateCreating              // claimed under a CreationPermit, not registered yet
	StateLive                  // registered and reservable
)

func (s State) String() string {
	switch s {
	case StateFree:
		return "free"
	case StateCreating:
		return "creating"
	case StateLive:
		return "live"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Candidate is one resource usable for a key, as the fleet sees it at the
// moment it was read. Fields may be added: read it, do not construct it.
type Candidate struct {
	ID       ResourceID
	Lane     int  // owner's lane
	Local    bool // owned by this process
	Capacity int
	InUse    int // accepted executions
	Pending  int // reservations not yet accepted
	State    State
}

// Room is how many more reservations the candidate could take now.
func (c Candidate) Room() int {
	r := c.Capacity - c.InUse - c.Pending
	if free := PendingReservations - c.Pending; r > free {
		r = free
	}
	return max(r, 0)
}
