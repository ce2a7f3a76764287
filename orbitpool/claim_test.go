package orbitpool

import "testing"

// TestClaimRecord: marks whose counters name the same word all stay known
// while under way, whichever of them holds the word, and none is known once
// removed; Reconcile takes an unknown claim of this process for corrupt.
func TestClaimRecord(t *testing.T) {
	var r claimRecord
	n := uint64(len(r.words))
	marks := []uint64{
		makeTicket(3, 7, 5) | claimFlag,
		makeTicket(3, 7, uint32(5+n)) | claimFlag,
		makeTicket(3, 7, uint32(5+2*n)) | claimFlag,
		makeTicket(3, 7, 6) | claimFlag,
	}
	for _, m := range marks {
		r.add(m)
	}
	for _, m := range marks {
		if !r.has(m) {
			t.Fatalf("mark %#x added, not known", m)
		}
	}
	r.remove(marks[0]) // the word's holder: the others are in the map
	r.remove(marks[2])
	if r.has(marks[0]) || r.has(marks[2]) {
		t.Fatal("a removed mark is still known")
	}
	if !r.has(marks[1]) || !r.has(marks[3]) {
		t.Fatal("removing marks of the same word lost another")
	}
	late := makeTicket(3, 7, uint32(5+3*n)) | claimFlag
	r.add(late) // takes the freed word
	if !r.has(late) || !r.has(marks[1]) {
		t.Fatal("a mark added after the word was freed, or the one in the map, not known")
	}
	for _, m := range []uint64{late, marks[1], marks[3]} {
		r.remove(m)
	}
	for i := range r.words {
		if w := r.words[i].Load(); w != 0 {
			t.Fatalf("word %d holds %#x after every mark was removed", i, w)
		}
	}
	if len(r.more) != 0 {
		t.Fatalf("%d marks left in the map after every mark was removed", len(r.more))
	}
}
