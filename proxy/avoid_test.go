package proxy

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAvoidLeavingOwnerNotItsSuccessor: a request keeps off the connections
// of an owner that refused it as leaving the fleet, for the rest of its
// attempts and its wait on the pool; but not off those of the process that
// takes the lane next. Under a cap those may be all the key has (here the
// one connection allowed), and a request that kept off them would wait out
// its deadline.
func TestAvoidLeavingOwnerNotItsSuccessor(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	old := newMember(t, spec, nil)
	client := newMember(t, spec, nil)
	warm(t, old, srv.URL)
	key := mustKey(t, client.tr, srv.URL)
	lane := old.pool.Lane()

	avoid := &avoided{leaving: []leftOwner{{lane, old.pool.Incarnation()}}}
	policy := &avoidPolicy{inner: orbitpool.LocalFirst{}, avoid: avoid, pool: client.pool}
	decide := func() (orbitpool.Decision, []orbitpool.Candidate) {
		cs, err := client.pool.Candidates(key, nil)
		if err != nil {
			t.Fatal(err)
		}
		v := &orbitpool.View{Key: key, Candidates: cs, Total: len(cs), Limits: orbitpool.Limits{MaxResources: 1}}
		return policy.Decide(v), cs
	}
	if d, cs := decide(); len(cs) != 1 || d.Action != orbitpool.ActionWait {
		t.Fatalf("with the leaving owner's connection the only one (%+v): %+v; want a wait", cs, d)
	}

	old.node.Close()
	old.pool.Close()
	next := newMember(t, spec, nil)
	if next.pool.Lane() != lane {
		t.Fatalf("the new process took lane %d, not the freed lane %d", next.pool.Lane(), lane)
	}
	warm(t, next, srv.URL)
	d, cs := decide()
	if d.Action != orbitpool.ActionReuse || d.Candidate < 0 || d.Candidate >= len(cs) || cs[d.Candidate].Lane != lane {
		t.Fatalf("with lane %d's new owner's connection the only one (%+v): %+v; want it reused", lane, cs, d)
	}
}
