package caddymodule

import (
	"slices"
	"sync"

	"github.com/orbitproxy/orbit/orbitpool"
)

// keyNames maps the pool keys this process has sent requests to onto the
// upstreams' names (scheme://host:port). A key another process named but
// this one never used has no name here.
var keyNames sync.Map // orbitpool.Key -> *nameSet

type nameSet struct {
	mu    sync.Mutex
	names []string
}

func nameKey(k orbitpool.Key, name string) {
	v, _ := keyNames.LoadOrStore(k, new(nameSet))
	ns := v.(*nameSet)
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if !slices.Contains(ns.names, name) {
		ns.names = append(ns.names, name)
		slices.Sort(ns.names)
	}
}

// upstreamNames returns the names known for k, sorted.
func upstreamNames(k orbitpool.Key) []string {
	v, ok := keyNames.Load(k)
	if !ok {
		return nil
	}
	ns := v.(*nameSet)
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return slices.Clone(ns.names)
}
