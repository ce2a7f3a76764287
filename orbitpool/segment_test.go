package orbitpool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSegmentValidation(t *testing.T) {
	valid := func(t *testing.T) string {
		path := filepath.Join(t.TempDir(), "seg")
		opts := testOpts
		opts.KeepSegment = true
		p, err := Open(PoolSpec{Path: path, Lanes: 2, Keys: 8, ResourcesPerLane: 4}, opts)
		if err != nil {
			t.Fatal(err)
		}
		p.Close()
		return path
	}
	spec := func(path string) PoolSpec { return PoolSpec{Path: path, Lanes: 2, Keys: 8, ResourcesPerLane: 4} }
	patch := func(t *testing.T, path string, off int, b []byte) {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt(b, int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	u32 := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

	for _, tc := range []struct {
		name   string
		mangle func(t *testing.T, path string) PoolSpec
		want   error
		text   string
	}{
		{"reopen", func(t *testing.T, path string) PoolSpec { return spec(path) }, nil, ""},
		{"other lanes", func(t *testing.T, path string) PoolSpec {
			s := spec(path)
			s.Lanes = 3
			return s
		}, ErrIncompatible, "lanes 2, this process asks for 3"},
		{"other keys", func(t *testing.T, path string) PoolSpec {
			s := spec(path)
			s.Keys = 9
			return s
		}, ErrIncompatible, "keys 8"},
		{"other kind", func(t *testing.T, path string) PoolSpec {
			s := spec(path)
			s.Kind = 7
			return s
		}, ErrIncompatible, "kind"},
		{"other protocol", func(t *testing.T, path string) PoolSpec {
			s := spec(path)
			s.Protocol = 9
			return s
		}, ErrIncompatible, "speak protocol 0 to each other, this process speaks 9"},
		{"abi", func(t *testing.T, path string) PoolSpec {
			patch(t, path, hdrABI, u32(abiVersion+1))
			return spec(path)
		}, ErrIncompatible, fmt.Sprintf("ABI version %d", abiVersion+1)},
		{"magic", func(t *testing.T, path string) PoolSpec {
			patch(t, path, hdrMagic, []byte("NOTAPOOL"))
			return spec(path)
		}, ErrIncompatible, "not a pool segment"},
		{"checksum", func(t *testing.T, path string) PoolSpec {
			patch(t, path, hdrCreated, []byte{1, 2, 3})
			return spec(path)
		}, ErrCorrupt, "checksum"},
		{"truncated", func(t *testing.T, path string) PoolSpec {
			os.Truncate(path, 100)
			return spec(path)
		}, ErrCorrupt, "too small"},
		{"short", func(t *testing.T, path string) PoolSpec {
			fi, _ := os.Stat(path)
			os.Truncate(path, fi.Size()-4096)
			return spec(path)
		}, ErrCorrupt, "bytes and its header says"},
		{"half-made", func(t *testing.T, path string) PoolSpec {
			// A creator that died before writing the magic: start over.
			patch(t, path, hdrMagic, make([]byte, 8))
			s := spec(path)
			s.Lanes = 3
			return s
		}, nil, ""},
		{"mode", func(t *testing.T, path string) PoolSpec {
			os.Chmod(path, 0o644)
			return spec(path)
		}, nil, "mode 0644"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := valid(t)
			p, err := Open(tc.mangle(t, path), testOpts)
			if err == nil {
				p.Close()
			}
			switch {
			case tc.want == nil && tc.text == "":
				if err != nil {
					t.Fatalf("open: %v", err)
				}
			case err == nil:
				t.Fatal("open succeeded")
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("error %v, want %v", err, tc.want)
			case !strings.Contains(err.Error(), tc.text):
				t.Fatalf("error %q does not say %q", err, tc.text)
			}
		})
	}
}

func TestSegmentFileIsPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	openShared(t, PoolSpec{Path: path, Lanes: 2, Keys: 8, ResourcesPerLane: 4}, 1)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("segment mode %v, want 0600", fi.Mode().Perm())
	}
	if want := SegmentSize(PoolSpec{Lanes: 2, Keys: 8, ResourcesPerLane: 4}); fi.Size() != want {
		t.Fatalf("segment is %d bytes, SegmentSize says %d", fi.Size(), want)
	}
}

func TestSpecValidation(t *testing.T) {
	for _, s := range []PoolSpec{
		{Lanes: MaxLanes + 1},
		{Lanes: -1},
		{Keys: -5},
		{ResourcesPerLane: MaxResourcesPerLane + 1},
	} {
		if _, err := Open(s, testOpts); err == nil {
			t.Errorf("spec %+v accepted", s)
		}
	}
	if d := SegmentSize(PoolSpec{}); d < SegmentSize(PoolSpec{Lanes: 1}) {
		t.Errorf("default segment %d smaller than a one-lane one", d)
	}
}

func TestLeaseEncoding(t *testing.T) {
	l := Lease{ID: makeID(3, 17, 12345), Owner: 0xdeadbeef, Ticket: makeTicket(2, 9, 77), Bit: 5}
	b, err := l.MarshalBinary()
	if err != nil || len(b) != LeaseSize {
		t.Fatalf("marshal: %d bytes, %v", len(b), err)
	}
	var got Lease
	if err := got.UnmarshalBinary(b); err != nil || got != l {
		t.Fatalf("round trip: %+v %v, want %+v", got, err, l)
	}
	if got.ID.Lane() != 3 || got.ID.Slot() != 17 || got.ID.Generation() != 12345 {
		t.Fatalf("id fields of %v", got.ID)
	}
	for name, mangle := range map[string]func(b []byte) []byte{
		"short":      func(b []byte) []byte { return b[:LeaseSize-1] },
		"long":       func(b []byte) []byte { return append(b, 0) },
		"version":    func(b []byte) []byte { b[0] = 9; return b },
		"reserved":   func(b []byte) []byte { b[4] = 1; return b },
		"bit":        func(b []byte) []byte { b[1] = PendingReservations; return b },
		"generation": func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], uint64(makeID(3, 17, 0))); return b },
		"ticket":     func(b []byte) []byte { clear(b[24:32]); return b },
	} {
		bad := mangle(append([]byte(nil), b...))
		if err := new(Lease).UnmarshalBinary(bad); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// The last process to leave removes the segment, unless told to keep it; one
// that joins while the last leaves never ends up on a file nobody can find.
func TestLastMemberRemovesSegment(t *testing.T) {
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 2, Keys: 8, ResourcesPerLane: 4}
	exists := func() bool { _, err := os.Stat(spec.Path); return err == nil }
	a, err := Open(spec, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(spec, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if !exists() {
		t.Fatal("segment removed while a member remained")
	}
	b.Close()
	if exists() {
		t.Fatal("segment left behind by the last member")
	}

	keep := testOpts
	keep.KeepSegment = true
	c, err := Open(spec, keep)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if !exists() {
		t.Fatal("KeepSegment: segment removed")
	}

	for i := range 100 {
		last, err := Open(spec, testOpts)
		if err != nil {
			t.Fatal(err)
		}
		joined := make(chan *Pool)
		go func() {
			p, err := Open(spec, testOpts)
			if err != nil {
				t.Error(err)
			}
			joined <- p
		}()
		last.Close()
		p := <-joined
		if p == nil {
			return
		}
		if named, err := p.seg.named(); err != nil || !named {
			t.Fatalf("round %d: a process joined a segment whose name was removed (%v)", i, err)
		}
		p.Close()
	}
}
