package orbitpool

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
)

// adv49: a key is placed within maxProbe (64) index entries of its hash's
// home. The hash was public (mix64 of the caller's digest), so names could
// be ground offline (here: SHA-256 digests of upstream-like names, as the
// proxy's keyFor makes them) until 128 of them homed at entries 0 and 64 of
// the default index. With those 128 keys live, a key whose home lay in
// [0, 64] found no free index entry within reach and was refused with
// ErrFull, while the table held 128 of its 1024 keys: one tenant's upstream
// names could deny another's. The hash is now keyed by a seed each segment
// draws at random: the names ground against the unkeyed hash (all an
// attacker can compute) spread over the index.

// adv49Unkeyed is the index hash an attacker can compute: the segment's,
// without its seed.
func adv49Unkeyed(k Key) uint64 { return mix64(k.Hi + mix64(k.Lo)) }

func adv49Digest(name string) Key {
	sum := sha256.Sum256([]byte(name))
	return Key{Hi: binary.BigEndian.Uint64(sum[0:8]), Lo: binary.BigEndian.Uint64(sum[8:16])}
}

func TestAdv49CraftedKeysDenyInnocentKey(t *testing.T) {
	p, err := Open(PoolSpec{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	m := uint64(p.l.nindex - 1)
	var homes [2]int
	n := 0
	for i := 0; homes[0] < maxProbe || homes[1] < maxProbe; i++ {
		k := adv49Digest(fmt.Sprintf("https://x%d.attacker.example:443", i))
		h := adv49Unkeyed(k) & m
		for j, want := range []uint64{0, maxProbe} {
			if h == want && homes[j] < maxProbe {
				if _, err := p.Register(k, 1); err != nil {
					t.Fatalf("crafted key %d: %v", n, err)
				}
				homes[j]++
				n++
			}
		}
	}
	var victim Key
	var home uint64
	for i := 0; ; i++ {
		victim = adv49Digest(fmt.Sprintf("https://shop%d.victim.example:443", i))
		if home = adv49Unkeyed(victim) & m; home >= 1 && home < maxProbe {
			break
		}
	}
	snap, _ := p.Snapshot()
	if _, err := p.Register(victim, 1); err != nil {
		t.Fatalf("with %d of %d keys named (%d crafted), an ordinary key homing at index entry %d cannot be named: %v (ErrFull: %v)",
			len(snap.Keys), p.l.nkeys, n, home, err, errors.Is(err, ErrFull))
	}
}

// TestKeyHashSeedPerSegment: every process of a fleet places keys with its
// segment's seed, and another segment draws another.
func TestKeyHashSeedPerSegment(t *testing.T) {
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 2, Keys: 8, ResourcesPerLane: 4}
	a, err := Open(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	spec.Path = filepath.Join(t.TempDir(), "other")
	c, err := Open(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if a.seg.seed != b.seg.seed || a.seg.seed == c.seg.seed || a.seg.seed == [2]uint64{} {
		t.Fatalf("seeds: %x and %x on one segment, %x on another", a.seg.seed, b.seg.seed, c.seg.seed)
	}
	// A key one names, the other finds.
	k := adv49Digest("https://shared.example:443")
	if _, err := a.Register(k, 1); err != nil {
		t.Fatal(err)
	}
	if ref, ok := b.lookupKey(k); !ok {
		t.Fatalf("a key named by one process is not found by the other (%+v)", ref)
	}
}
