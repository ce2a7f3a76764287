package proxy

import (
	"sync"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
	"go.uber.org/zap"
)

// spares are a process's idle connections outside the table (see
// Transport.unpooled), kept for the next request of their key that finds
// the table full, as net/http keeps its idle connections: a process whose
// every slot holds a long-lived exchange would otherwise dial once for every
// other request. They are neither shared nor counted in the table; the
// sweep closes them as it does the table's idle connections. Once the table
// has room again, a request that would dial takes one into it instead (see
// Transport.pool), where siblings share it.
type spares struct {
	mu     sync.Mutex
	closed bool
	byKey  map[orbitpool.Key][]spare // most recently idle last
	n      int
}

// spare is a kept connection, with the settings of the transport that
// dialed it.
type spare struct {
	c *conn
	s *connSettings
}

// len is how many connections are kept.
func (sp *spares) len() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.n
}

// has reports whether a connection is kept for key.
func (sp *spares) has(key orbitpool.Key) bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return len(sp.byKey[key]) > 0
}

// maxSparesPerKey is how many idle connections outside the table a process
// keeps for one key: as many as the stock transport keeps idle per host
// (keepalive_idle_conns_per_host).
const maxSparesPerKey = 32

// put keeps c idle for key, and reports whether it did: not once the node
// is closing, nor beyond maxSparesPerKey, nor beyond max in all.
func (sp *spares) put(key orbitpool.Key, c *conn, s *connSettings, max int) bool {
	c.idleAt = time.Now()
	if s.expired(c, c.idleAt, sinceStart(c.idleAt)) {
		return false
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.closed || sp.n >= max || len(sp.byKey[key]) >= maxSparesPerKey {
		return false
	}
	if sp.byKey == nil {
		sp.byKey = make(map[orbitpool.Key][]spare)
	}
	sp.byKey[key] = append(sp.byKey[key], spare{c, s})
	sp.n++
	return true
}

// take returns key's most recently idle connection that is still fit, with
// its settings, or nil; closed reports each unfit one, which it has closed.
func (sp *spares) take(key orbitpool.Key, log *zap.Logger, closed func()) (*conn, *connSettings) {
	for {
		sp.mu.Lock()
		l := sp.byKey[key]
		if len(l) == 0 {
			sp.mu.Unlock()
			return nil, nil
		}
		s := l[len(l)-1]
		l[len(l)-1] = spare{}
		if l = l[:len(l)-1]; len(l) == 0 {
			delete(sp.byKey, key)
		} else {
			sp.byKey[key] = l
		}
		sp.n--
		sp.mu.Unlock()
		if s.fit(time.Now(), log) {
			return s.c, s.s
		}
		s.c.close()
		closed()
	}
}

// fit reports whether s may carry another exchange: within its limits, and
// neither closed nor written to by its upstream while idle.
func (s spare) fit(now time.Time, log *zap.Logger) bool {
	return !s.s.expired(s.c, now, sinceStart(s.c.idleAt)) && s.c.idleAlive(log)
}

// sweep closes the connections that are no longer fit; closed reports each.
// It holds the lock throughout: a check costs a system call, or tlsPeekWait
// at most for a TLS connection with bytes pending.
func (sp *spares) sweep(now time.Time, log *zap.Logger, closed func()) {
	var gone []spare
	sp.mu.Lock()
	for key, l := range sp.byKey {
		kept := l[:0]
		for _, s := range l {
			if s.fit(now, log) {
				kept = append(kept, s)
			} else {
				gone = append(gone, s)
			}
		}
		clear(l[len(kept):])
		if len(kept) == 0 {
			delete(sp.byKey, key)
		} else {
			sp.byKey[key] = kept
		}
	}
	sp.n -= len(gone)
	sp.mu.Unlock()
	for _, s := range gone {
		s.c.close()
		closed()
	}
}

// closeAll closes every spare connection, closed reporting each; with
// forGood, none is kept after.
func (sp *spares) closeAll(forGood bool, closed func()) {
	sp.mu.Lock()
	all := sp.byKey
	sp.byKey = nil
	for _, l := range all {
		sp.n -= len(l)
	}
	if forGood {
		sp.closed = true
	}
	sp.mu.Unlock()
	for _, l := range all {
		for _, s := range l {
			s.c.close()
			closed()
		}
	}
}
