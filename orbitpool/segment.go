package orbitpool

import (
	"crypto/rand"
	"errors"
	"fmt"
	"hash/crc64"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// abiVersion changes whenever the segment layout or the meaning of a word
// changes; processes of different versions must not share a segment.
const abiVersion = 9

// segmentMagic marks an initialised segment; it is written last at creation.
const segmentMagic uint64 = 0x4f52_4249_5450_4f4c // "ORBITPOL"

// Header offsets.
const (
	hdrMagic    = 0
	hdrABI      = 8  // uint32
	hdrKind     = 12 // uint32
	hdrLanes    = 16 // uint32
	hdrKeys     = 20 // uint32
	hdrPerLane  = 24 // uint32
	hdrPending  = 28 // uint32
	hdrSize     = 32
	hdrCreated  = 40
	hdrProtocol = 48 // uint32
	hdrChecksum = 56 // crc64 of bytes [8, 56) and of the hash seed

	// hdrWriterWaiting is when (CLOCK_MONOTONIC nanoseconds, system-wide) a
	// process last said it waits to take the structure lock exclusively;
	// 0 when none does. See lockStructure.
	hdrWriterWaiting = 64

	// hdrHashSeed keys the hash that places keys in the key index (two
	// uint64): random for each segment, and readable only by the fleet's
	// user, so that no one who can choose upstream names can choose them to
	// crowd one stretch of the index and deny other keys an entry.
	hdrHashSeed = 72
)

// A process waiting for the structure lock exclusively refreshes its intent at
// least every writerPoll; readers defer to an intent younger than
// writerIntentFresh, so one left by a process that died fades at once, and
// never for longer than maxYield, so a stream of writers cannot starve them.
const (
	writerPoll        = time.Millisecond
	writerIntentFresh = 10 * time.Millisecond
	maxYield          = 100 * time.Millisecond
)

// Lock bytes in the segment file. OFD locks are advisory and may lie past the
// end of the file; they never touch the mapped data.
const (
	lockStructure = 0
	lockLaneBase  = 64
)

var crcTable = crc64.MakeTable(crc64.ECMA)

// segment is one mapping of the pool table.
type segment struct {
	path string
	f    *os.File // nil for a process-memory segment
	data []byte
	base unsafe.Pointer
	l    layout
	seed [2]uint64 // the header's hash seed (see hdrHashSeed)

	// The structure lock is a readers-writer lock across processes: an OFD
	// lock on one byte, write for structural changes, read for the budget
	// operations that change a key's counters and a slot together, so that
	// a reclaim never sees one half of such an operation from a live
	// process. OFD locks taken through one open file description do not
	// exclude each other, so structMu excludes within this process and
	// readers counts the goroutines sharing the read lock.
	structMu sync.RWMutex
	readMu   sync.Mutex
	readers  int

	// intent is the header's hdrWriterWaiting word, through hdr (the
	// header alone, mapped to wait for the lock that guards validating and
	// mapping the rest) or through data; nil until one is mapped.
	intent *uint64
	hdr    []byte
}

func (s *segment) u64(off int) *uint64 { return (*uint64)(unsafe.Add(s.base, off)) }
func (s *segment) u32(off int) *uint32 { return (*uint32)(unsafe.Add(s.base, off)) }

// openSegment maps the segment spec names, creating it if it does not exist,
// and returns it with the structure lock held.
func openSegment(spec PoolSpec) (*segment, error) {
	l := newLayout(spec)
	if spec.Path == "" {
		data, err := unix.Mmap(-1, 0, l.size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, fmt.Errorf("orbitpool: map %d bytes of process memory: %w", l.size, err)
		}
		s := &segment{data: data, base: unsafe.Pointer(&data[0]), l: l}
		s.structMu.Lock()
		s.initHeader()
		s.seed = [2]uint64{*s.u64(hdrHashSeed), *s.u64(hdrHashSeed + 8)}
		return s, nil
	}

	// O_NOFOLLOW: /dev/shm is writable by everyone, so a symlink planted
	// there must not redirect the segment to a file of the victim's.
	// The last process to leave a fleet removes the segment's name under
	// the structure lock; one that opened the file just before then finds,
	// once it holds the lock, that the name is gone, and opens it anew.
	var s *segment
	for attempt := 0; ; attempt++ {
		f, err := os.OpenFile(spec.Path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("orbitpool: open segment: %w", err)
		}
		s = &segment{path: spec.Path, f: f, l: l}
		if err := s.checkOwnership(); err != nil {
			f.Close()
			return nil, err
		}
		s.mapIntent()
		if err := s.lockStructure(); err != nil {
			s.close()
			return nil, err
		}
		named, err := s.named()
		if err != nil || named || attempt == 8 {
			if err == nil && !named {
				err = fmt.Errorf("orbitpool: segment %s keeps being removed while it is opened", s.path)
			}
			if err != nil {
				s.unlockStructure()
				s.close()
				return nil, err
			}
			break
		}
		s.unlockStructure()
		s.close()
	}
	if err := s.mapAndValidate(); err != nil {
		s.unlockStructure()
		s.close()
		return nil, err
	}
	s.intent = s.u64(hdrWriterWaiting)
	if s.hdr != nil {
		unix.Munmap(s.hdr)
		s.hdr = nil
	}
	return s, nil
}

// mapIntent maps the header of a segment in use, so that joining it can wait
// for the structure lock as every other writer does. A segment that is new,
// half made or of another version is left alone: nobody can be using it, and
// mapAndValidate may resize it, which would fault a mapping.
func (s *segment) mapIntent() {
	var st unix.Stat_t
	if err := unix.Fstat(int(s.f.Fd()), &st); err != nil || st.Size < headerSize {
		return
	}
	hdr, err := unix.Mmap(int(s.f.Fd()), 0, headerSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return
	}
	if atomic.LoadUint64((*uint64)(unsafe.Pointer(&hdr[hdrMagic]))) != segmentMagic ||
		atomic.LoadUint32((*uint32)(unsafe.Pointer(&hdr[hdrABI]))) != abiVersion {
		unix.Munmap(hdr)
		return
	}
	s.hdr = hdr
	s.intent = (*uint64)(unsafe.Pointer(&hdr[hdrWriterWaiting]))
}

// checkOwnership refuses a segment another user could read or write: its
// table decides who may use whose upstream connections.
func (s *segment) checkOwnership() error {
	var st unix.Stat_t
	if err := unix.Fstat(int(s.f.Fd()), &st); err != nil {
		return fmt.Errorf("orbitpool: stat segment %s: %w", s.path, err)
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("orbitpool: segment %s belongs to uid %d, not to this process's uid %d", s.path, st.Uid, os.Geteuid())
	}
	if st.Mode&0o077 != 0 {
		return fmt.Errorf("orbitpool: segment %s has mode %#o; it must be 0600 (readable by its owner only)", s.path, st.Mode&0o777)
	}
	return nil
}

func (s *segment) mapAndValidate() error {
	var st unix.Stat_t
	if err := unix.Fstat(int(s.f.Fd()), &st); err != nil {
		return fmt.Errorf("orbitpool: stat segment %s: %w", s.path, err)
	}
	fd := int(s.f.Fd())
	fresh := st.Size == 0
	if !fresh {
		if st.Size < headerSize {
			return fmt.Errorf("orbitpool: segment %s is %d bytes, too small for a header: %w", s.path, st.Size, ErrCorrupt)
		}
		hdr, err := unix.Mmap(fd, 0, headerSize, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return fmt.Errorf("orbitpool: map segment %s header: %w", s.path, err)
		}
		magic := atomic.LoadUint64((*uint64)(unsafe.Pointer(&hdr[0])))
		var verr error
		if magic != 0 {
			verr = s.validateHeader(hdr, st.Size)
		}
		unix.Munmap(hdr)
		if verr != nil {
			return verr
		}
		// A zero magic is a creator that died before finishing; we hold
		// the structure lock, so nobody can be using it: start over.
		fresh = magic == 0
	}
	if fresh {
		if err := unix.Ftruncate(fd, 0); err != nil {
			return fmt.Errorf("orbitpool: reset segment %s: %w", s.path, err)
		}
		// Allocate every page now, so that a full /dev/shm fails here and
		// not later with SIGBUS in whichever process touches the page.
		if err := unix.Fallocate(fd, 0, 0, int64(s.l.size)); err != nil {
			if !errors.Is(err, unix.EOPNOTSUPP) {
				return fmt.Errorf("orbitpool: allocate %d bytes for segment %s: %w", s.l.size, s.path, err)
			}
			if err := unix.Ftruncate(fd, int64(s.l.size)); err != nil {
				return fmt.Errorf("orbitpool: size segment %s: %w", s.path, err)
			}
		}
	}
	data, err := unix.Mmap(fd, 0, s.l.size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("orbitpool: map segment %s: %w", s.path, err)
	}
	s.data, s.base = data, unsafe.Pointer(&data[0])
	if fresh {
		s.initHeader()
	}
	s.seed = [2]uint64{atomic.LoadUint64(s.u64(hdrHashSeed)), atomic.LoadUint64(s.u64(hdrHashSeed + 8))}
	return nil
}

func (s *segment) validateHeader(hdr []byte, fileSize int64) error {
	u32 := func(off int) uint32 { return *(*uint32)(unsafe.Pointer(&hdr[off])) }
	u64 := func(off int) uint64 { return *(*uint64)(unsafe.Pointer(&hdr[off])) }
	if m := u64(hdrMagic); m != segmentMagic {
		return fmt.Errorf("orbitpool: %s is not a pool segment (magic %#x): %w", s.path, m, ErrIncompatible)
	}
	if v := u32(hdrABI); v != abiVersion {
		return fmt.Errorf("orbitpool: segment %s has ABI version %d, this build speaks %d; stop the fleet and remove the segment, or use another path: %w", s.path, v, abiVersion, ErrIncompatible)
	}
	if sum := headerSum(hdr); sum != u64(hdrChecksum) {
		return fmt.Errorf("orbitpool: segment %s header checksum %#x, computed %#x: %w", s.path, u64(hdrChecksum), sum, ErrCorrupt)
	}
	want := s.l.spec
	for _, f := range []struct {
		name      string
		got, want uint64
	}{
		{"kind", uint64(u32(hdrKind)), uint64(want.Kind)},
		{"lanes", uint64(u32(hdrLanes)), uint64(want.Lanes)},
		{"keys", uint64(u32(hdrKeys)), uint64(want.Keys)},
		{"resources per lane", uint64(u32(hdrPerLane)), uint64(want.ResourcesPerLane)},
		{"pending reservations", uint64(u32(hdrPending)), PendingReservations},
	} {
		if f.got != f.want {
			return fmt.Errorf("orbitpool: segment %s was made with %s %d, this process asks for %d; every process of a fleet must use one spec: %w", s.path, f.name, f.got, f.want, ErrIncompatible)
		}
	}
	if got := u32(hdrProtocol); got != want.Protocol {
		return fmt.Errorf("orbitpool: segment %s was made by processes that speak protocol %d to each other, this process speaks %d (another build); every process of a fleet must run builds of one protocol: stop the processes of the other build (remove the segment if none is left), or give this fleet another segment path: %w", s.path, got, want.Protocol, ErrIncompatible)
	}
	if size := u64(hdrSize); size != uint64(s.l.size) || fileSize != int64(size) {
		return fmt.Errorf("orbitpool: segment %s is %d bytes and its header says %d, want %d: %w", s.path, fileSize, size, s.l.size, ErrCorrupt)
	}
	return nil
}

func (s *segment) initHeader() {
	sp := s.l.spec
	*s.u32(hdrABI) = abiVersion
	*s.u32(hdrKind) = sp.Kind
	*s.u32(hdrLanes) = uint32(sp.Lanes)
	*s.u32(hdrKeys) = uint32(sp.Keys)
	*s.u32(hdrPerLane) = uint32(sp.ResourcesPerLane)
	*s.u32(hdrPending) = PendingReservations
	*s.u32(hdrProtocol) = sp.Protocol
	*s.u64(hdrSize) = uint64(s.l.size)
	*s.u64(hdrCreated) = uint64(time.Now().UnixNano())
	rand.Read(s.data[hdrHashSeed : hdrHashSeed+16])
	*s.u64(hdrChecksum) = headerSum(s.data)
	atomic.StoreUint64(s.u64(hdrMagic), segmentMagic)
}

// headerSum is the checksum of a segment's header: of its fields, and of
// its hash seed.
func headerSum(hdr []byte) uint64 {
	return crc64.Update(crc64.Checksum(hdr[hdrABI:hdrChecksum], crcTable), crcTable, hdr[hdrHashSeed:hdrHashSeed+16])
}

// keyHash places k in the key index, keyed by the segment's seed.
func (s *segment) keyHash(k Key) uint64 {
	return mix64(k.Hi ^ s.seed[0] + mix64(k.Lo^s.seed[1]))
}

// flock applies an OFD lock of typ to one byte.
func (s *segment) flock(cmd int, typ int16, at int64) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: at, Len: 1}
	for {
		err := unix.FcntlFlock(s.f.Fd(), cmd, &lk)
		if err != unix.EINTR {
			return err
		}
	}
}

// lockStructure takes the structure lock exclusively. An OFD write lock
// waiting in the kernel gives way to every new reader, so a process whose
// goroutines keep the lock shared without a gap would hold it off for good.
// Instead the writer polls for the lock and, while it cannot have it, keeps
// its intent fresh in the header; new readers in every process defer to it.
func (s *segment) lockStructure() error {
	s.structMu.Lock()
	if s.f == nil {
		return nil
	}
	if err := s.writeLock(); err != nil {
		s.structMu.Unlock()
		return fmt.Errorf("orbitpool: lock segment %s: %w", s.path, err)
	}
	return nil
}

func (s *segment) writeLock() error {
	if s.intent == nil {
		return s.flock(unix.F_OFD_SETLKW, unix.F_WRLCK, lockStructure)
	}
	var mine uint64
	for backoff := 20 * time.Microsecond; ; backoff = min(2*backoff, writerPoll) {
		err := s.flock(unix.F_OFD_SETLK, unix.F_WRLCK, lockStructure)
		if err == nil {
			if mine != 0 {
				atomic.CompareAndSwapUint64(s.intent, mine, 0)
			}
			return nil
		}
		if err != unix.EAGAIN && err != unix.EACCES {
			return err
		}
		mine = uint64(monotonicNow())
		atomic.StoreUint64(s.intent, mine)
		time.Sleep(backoff)
	}
}

func (s *segment) unlockStructure() {
	if s.f != nil {
		s.flock(unix.F_OFD_SETLK, unix.F_UNLCK, lockStructure)
	}
	s.structMu.Unlock()
}

// rlockStructure takes the structure lock shared. A process that dies
// holding it loses it with its file description, like the exclusive one.
func (s *segment) rlockStructure() error {
	s.yieldToWriter()
	s.structMu.RLock()
	if s.f == nil {
		return nil
	}
	s.readMu.Lock()
	defer s.readMu.Unlock()
	if s.readers == 0 {
		if err := s.flock(unix.F_OFD_SETLKW, unix.F_RDLCK, lockStructure); err != nil {
			s.structMu.RUnlock()
			return fmt.Errorf("orbitpool: lock segment %s: %w", s.path, err)
		}
	}
	s.readers++
	return nil
}

// yieldToWriter waits while some process says it waits for the structure lock
// exclusively, so that the readers already in drain and let it in.
func (s *segment) yieldToWriter() {
	if s.intent == nil || atomic.LoadUint64(s.intent) == 0 {
		return
	}
	var since int64
	for {
		t := int64(atomic.LoadUint64(s.intent))
		now := monotonicNow()
		if t == 0 {
			return
		}
		// The clock is the host's: a time ahead of it was never written by
		// a writer, and one too old was left by a writer that is gone.
		// Either is cleared, so that nobody defers to it again.
		if now-t > int64(writerIntentFresh) || t > now {
			atomic.CompareAndSwapUint64(s.intent, uint64(t), 0)
			return
		}
		if since == 0 {
			since = now
		} else if now-since > int64(maxYield) {
			return
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func (s *segment) runlockStructure() {
	if s.f != nil {
		s.readMu.Lock()
		if s.readers--; s.readers == 0 {
			s.flock(unix.F_OFD_SETLK, unix.F_UNLCK, lockStructure)
		}
		s.readMu.Unlock()
	}
	s.structMu.RUnlock()
}

// monotonicNow reads CLOCK_MONOTONIC, which every process on the host shares.
func monotonicNow() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// holdLane takes the lock that marks lane as alive for as long as this
// process (or this open file description) lives.
func (s *segment) holdLane(lane int) error {
	if s.f == nil {
		return nil
	}
	return s.flock(unix.F_OFD_SETLK, unix.F_WRLCK, int64(lockLaneBase+lane))
}

func (s *segment) releaseLane(lane int) {
	if s.f != nil {
		s.flock(unix.F_OFD_SETLK, unix.F_UNLCK, int64(lockLaneBase+lane))
	}
}

// laneAlive asks the kernel whether some process still holds lane's lock.
// Only the OS can say a process is dead; a heartbeat can only say it is slow.
func (s *segment) laneAlive(lane int) (bool, error) {
	if s.f == nil {
		return true, nil
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: int64(lockLaneBase + lane), Len: 1}
	if err := unix.FcntlFlock(s.f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return true, fmt.Errorf("orbitpool: probe lane %d lock: %w", lane, err)
	}
	return lk.Type != unix.F_UNLCK, nil
}

// named reports whether the segment's path still names the file it opened.
func (s *segment) named() (bool, error) {
	var fst, pst unix.Stat_t
	if err := unix.Fstat(int(s.f.Fd()), &fst); err != nil {
		return false, fmt.Errorf("orbitpool: stat segment %s: %w", s.path, err)
	}
	if err := unix.Lstat(s.path, &pst); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("orbitpool: stat segment %s: %w", s.path, err)
	}
	return fst.Dev == pst.Dev && fst.Ino == pst.Ino, nil
}

// remove unlinks the segment's name, if it still names this file. The
// structure lock is held exclusively.
func (s *segment) remove() error {
	if s.f == nil {
		return nil
	}
	if named, err := s.named(); err != nil || !named {
		return err
	}
	if err := os.Remove(s.path); err != nil {
		return fmt.Errorf("orbitpool: removing segment %s: %w", s.path, err)
	}
	return nil
}

func (s *segment) close() {
	s.intent = nil
	if s.hdr != nil {
		unix.Munmap(s.hdr)
		s.hdr = nil
	}
	if s.data != nil {
		unix.Munmap(s.data)
		s.data, s.base = nil, nil
	}
	if s.f != nil {
		s.f.Close() // drops every OFD lock this description held
		s.f = nil
	}
}
