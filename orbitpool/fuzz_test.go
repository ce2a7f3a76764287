package orbitpool

// Fuzz tests. Run one for a minute with, for example,
//
//	go test -run '^$' -fuzz FuzzOpenSegment -fuzztime 60s ./orbitpool/

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fzSpec is tiny, so that a fuzz input covers a good part of the table.
var fzSpec = PoolSpec{Lanes: 3, Keys: 8, ResourcesPerLane: 4}

var fzKeys = []Key{{Hi: 0x667a, Lo: 1}, {Hi: 0x667a, Lo: 2}, {Hi: 0x667a, Lo: 3}, {Hi: 0x667a, Lo: 4}}

var fzImage = sync.OnceValues(fzBuildImage)

// fzBuildImage returns the bytes of a segment in use by two processes (two
// pools): resources on several keys, executions, reservations across lanes,
// a creation permit and a parked waiter.
func fzBuildImage() ([]byte, error) {
	dir, err := os.MkdirTemp("", "fzimg")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	spec := fzSpec
	spec.Path = filepath.Join(dir, "seg")
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour}
	a, err := Open(spec, opts)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	b, err := Open(spec, opts)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	step := func(err error) {
		if err != nil {
			panic(fmt.Sprintf("fuzz image: %v", err))
		}
	}
	a0, err := a.Register(fzKeys[0], 2)
	step(err)
	_, err = a.Register(fzKeys[1], 1)
	step(err)
	b0, err := b.Register(fzKeys[0], 3)
	step(err)
	plan, err := a.Acquire(context.Background(), fzKeys[1], LocalOnly{}, Limits{})
	step(err)
	_ = plan
	_, err = b.Reserve(a0)
	step(err)
	l, err := a.Reserve(b0)
	step(err)
	_, err = b.Accept(l)
	step(err)
	_, err = b.Reserve(b0)
	step(err)
	_, err = b.ClaimCreate(fzKeys[2], Limits{MaxResources: 2})
	step(err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go b.Acquire(ctx, fzKeys[1], LocalFirst{}, Limits{MaxResources: 1})
	deadline := time.Now().Add(10 * time.Second)
	for {
		snap, _ := a.Snapshot()
		if mpKS(snap, fzKeys[1]).Waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("fuzz image: waiter never parked")
		}
		time.Sleep(time.Millisecond)
	}
	return os.ReadFile(spec.Path)
}

// fzSum recomputes the header checksum, so that a mutated header field is
// judged by its value and not only refused for its checksum.
func fzSum(img []byte) {
	if len(img) >= headerSize {
		binary.LittleEndian.PutUint64(img[hdrChecksum:], headerSum(img))
	}
}

// fzXor flips bits of img from off on.
func fzXor(img []byte, off int, x []byte) {
	for i, c := range x {
		if off+i < len(img) {
			img[off+i] ^= c
		}
	}
}

// FuzzOpenSegment writes a mutated segment file (header bits flipped, with or
// without its checksum fixed, body bits flipped, size changed) and opens it:
// Open must fail with one of the pool's errors or give a pool on which every
// operation returns, errors allowed, without panicking. Lanes named in alive
// are held by the fuzzer as if their processes lived, so the pool reads their
// (corrupt) records instead of reclaiming them at once; they die later, and
// the table is corrupted again while the pool is open.
func FuzzOpenSegment(f *testing.F) {
	img, err := fzImage()
	if err != nil {
		f.Fatal(err)
	}
	le32 := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
	hdrAt := func(off int, x []byte) []byte { return append(make([]byte, off), x...) }
	slot0 := uint32(newLayout(fzSpec.WithDefaults()).slots - headerSize)
	keys := uint32(newLayout(fzSpec.WithDefaults()).keys - headerSize)
	// hdrX, bodyOff, bodyX, fix, size, alive, liveOff, liveX
	f.Add([]byte{}, uint32(0), []byte{}, false, uint32(0), uint8(0), uint32(0), []byte{})
	f.Add([]byte{}, uint32(0), []byte{}, false, uint32(0), uint8(3), uint32(0), []byte{})
	f.Add([]byte{0xff}, uint32(0), []byte{}, false, uint32(0), uint8(0), uint32(0), []byte{})                                                         // magic
	f.Add(hdrAt(hdrABI, le32(3)), uint32(0), []byte{}, true, uint32(0), uint8(0), uint32(0), []byte{})                                                // ABI
	f.Add(hdrAt(hdrLanes, le32(1)), uint32(0), []byte{}, true, uint32(0), uint8(0), uint32(0), []byte{})                                              // lanes
	f.Add(hdrAt(hdrSize, []byte{0, 0x10}), uint32(0), []byte{}, true, uint32(0), uint8(0), uint32(0), []byte{})                                       // size field
	f.Add(hdrAt(hdrMagic, binary.LittleEndian.AppendUint64(nil, segmentMagic)), uint32(0), []byte{}, false, uint32(0), uint8(0), uint32(0), []byte{}) // magic zeroed
	f.Add([]byte{}, uint32(0), []byte{}, false, uint32(100), uint8(0), uint32(0), []byte{})                                                           // truncated
	f.Add([]byte{}, uint32(0), []byte{}, false, uint32(len(img)+4096), uint8(0), uint32(0), []byte{})                                                 // grown
	f.Add([]byte{}, slot0, []byte{0xff, 0xff, 0xff, 0x0f}, false, uint32(0), uint8(1), uint32(0), []byte{})                                           // slot word
	f.Add([]byte{}, slot0+16, []byte{0xff, 0xff}, false, uint32(0), uint8(7), slot0+8, []byte{0x40, 0, 0, 0})                                         // capacity, meta
	f.Add([]byte{}, keys, []byte{0, 0, 0, 0, 0x3f}, false, uint32(0), uint8(2), keys+32, []byte{0xff, 0xff, 0xff})                                    // key ctl, mask
	f.Add([]byte{}, uint32(0), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, false, uint32(0), uint8(3), uint32(0), []byte{0xa})                        // lanes

	f.Fuzz(func(t *testing.T, hdrX []byte, bodyOff uint32, bodyX []byte, fix bool, size uint32, alive uint8, liveOff uint32, liveX []byte) {
		img := slices.Clone(img)
		fzXor(img, 0, hdrX[:min(len(hdrX), headerSize)])
		if len(bodyX) > 0 {
			fzXor(img, headerSize+int(bodyOff%uint32(len(img)-headerSize)), bodyX)
		}
		if fix {
			fzSum(img)
		}
		if size != 0 {
			n := int(size % uint32(2*len(img)))
			img = append(img, make([]byte, max(0, n-len(img)))...)[:n]
		}
		path := filepath.Join(t.TempDir(), "seg")
		if err := os.WriteFile(path, img, 0o600); err != nil {
			t.Fatal(err)
		}
		holder, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		for l := range fzSpec.Lanes {
			if alive&(1<<l) != 0 {
				lk := unix.Flock_t{Type: unix.F_WRLCK, Start: int64(lockLaneBase + l), Len: 1}
				if err := unix.FcntlFlock(holder.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
					t.Fatal(err)
				}
			}
		}
		// A hang is a failure too: crash with every goroutine's stack, so
		// that the fuzzer keeps the input.
		watchdog := time.AfterFunc(20*time.Second, func() {
			buf := make([]byte, 1<<20)
			panic(fmt.Sprintf("fuzz input still running after 20s:\n%s", buf[:runtime.Stack(buf, true)]))
		})
		defer watchdog.Stop()
		spec := fzSpec
		spec.Path = path
		// The dispatcher's futex sleep is bounded by ReconcileInterval: a
		// corrupt sleeping flag in the pool's own lane record can make the
		// doorbell skip its futex wake, and Close then waits that long.
		p, err := Open(spec, Options{ReconcileInterval: 20 * time.Millisecond, ReservationTimeout: time.Nanosecond})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrIncompatible) && !errors.Is(err, ErrFull) {
				t.Fatalf("open: %v, want ErrCorrupt, ErrIncompatible or ErrFull", err)
			}
			return
		}
		defer p.Close()
		fzExercise(t, p)
		if len(liveX) > 0 {
			// Corrupt the table under the open pool, through the file.
			off := int64(headerSize) + int64(liveOff%uint32(SegmentSize(spec)-headerSize))
			buf := make([]byte, len(liveX))
			n, _ := holder.ReadAt(buf, off)
			fzXor(buf[:n], 0, liveX)
			if _, err := holder.WriteAt(buf[:n], off); err != nil {
				t.Fatal(err)
			}
			fzExercise(t, p)
		}
		holder.Close() // the held lanes' processes die
		p.Reconcile()
		fzExercise(t, p)
		if err := p.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
	})
}

// fzExercise runs every operation of the pool once or so. Errors are fine;
// panics and hangs are not.
func fzExercise(t *testing.T, p *Pool) {
	if _, err := p.Snapshot(); err != nil {
		t.Fatalf("snapshot of an open pool: %v", err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	lim := Limits{MaxResources: 3, MaxCreating: 2}
	for _, k := range fzKeys {
		cands, _ := p.Candidates(k, nil)
		for _, c := range cands {
			c.Room()
			l, err := p.Reserve(c.ID)
			if err != nil {
				continue
			}
			if e, err := p.Accept(l); err == nil {
				e.Complete()
			}
		}
		plan, err := p.Acquire(done, k, LocalFirst{}, lim)
		if err == nil {
			switch plan.Kind {
			case PlanReuseLocal:
				plan.Execution.Complete()
			case PlanCreate:
				if e, err := plan.Permit.RegisterAndAccept(2); err == nil {
					e.Complete()
					p.Unregister(e.ID())
				}
				plan.Permit.Close()
			}
		}
	}
	if id, err := p.Register(fzKeys[3], 2); err == nil {
		if l, err := p.Reserve(id); err == nil {
			if e, err := p.Accept(l); err == nil {
				e.Close()
			}
		}
		p.Unregister(id)
	}
	if cp, err := p.ClaimCreate(fzKeys[0], Limits{MaxResources: 8}); err == nil {
		cp.Close()
	}
	p.Reconcile()
}

// FuzzLeaseUnmarshal: UnmarshalBinary never panics, leaves the lease alone
// when it refuses, and whatever it accepts re-encodes to the same bytes and
// is a lease Accept could take (a reservation bit, a generation, a ticket).
func FuzzLeaseUnmarshal(f *testing.F) {
	for _, l := range []Lease{
		{ID: makeID(0, 0, 1), Owner: 1, Ticket: 1},
		{ID: makeID(3, 17, 12345), Owner: 0xdeadbeef, Ticket: makeTicket(2, 9, 77), Bit: 5},
		{ID: makeID(MaxLanes-1, MaxResourcesPerLane, genMask), Owner: ^Incarnation(0), Ticket: ^uint64(0), Bit: PendingReservations - 1},
		{ID: ^ResourceID(0), Ticket: makeTicket(255, 1<<24-1, 1<<32-1), Bit: 3},
	} {
		b, err := l.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add(make([]byte, LeaseSize))
	f.Add(make([]byte, LeaseSize+1))
	f.Fuzz(func(t *testing.T, b []byte) {
		sentinel := Lease{ID: 7, Owner: 7, Ticket: 7, Bit: 7}
		l := sentinel
		if err := l.UnmarshalBinary(b); err != nil {
			if l != sentinel {
				t.Fatalf("refused %x (%v) but changed the lease to %+v", b, err, l)
			}
			return
		}
		if l.Bit >= PendingReservations || l.ID.Generation() == 0 || l.Ticket == 0 {
			t.Fatalf("accepted %x as %+v, which no Reserve returns", b, l)
		}
		out, err := l.MarshalBinary()
		if err != nil || !bytes.Equal(out, b) {
			t.Fatalf("%x decodes to %+v, which encodes to %x (%v)", b, l, out, err)
		}
		prefix := []byte("prefix")
		if app, err := l.AppendBinary(slices.Clone(prefix)); err != nil || !bytes.Equal(app, append(prefix, b...)) {
			t.Fatalf("AppendBinary of %+v: %x (%v)", l, app, err)
		}
		var again Lease
		if err := again.UnmarshalBinary(out); err != nil || again != l {
			t.Fatalf("round trip of %+v: %+v (%v)", l, again, err)
		}
	})
}
