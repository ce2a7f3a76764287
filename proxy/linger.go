package proxy

import (
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/orbitproxy/orbit/internal/sockdiag"
	"github.com/orbitproxy/orbit/orbitpool"
	"go.uber.org/zap"
)

// maxRemotes bounds the upstream addresses a key remembers (see sawRemote):
// a name that resolves to many keeps its latest.
const maxRemotes = 8

// sawRemote records a, a literal address of the key's upstream or one a
// connection of the key was dialed to, for lingering. kc may be nil.
func (kc *keyCap) sawRemote(a netip.AddrPort) {
	if kc == nil || !a.IsValid() {
		return
	}
	kc.remoteMu.Lock()
	defer kc.remoteMu.Unlock()
	if slices.Contains(kc.remotes, a) {
		return
	}
	if len(kc.remotes) == maxRemotes {
		kc.remotes = slices.Delete(kc.remotes, 0, 1)
	}
	kc.remotes = append(kc.remotes, a)
}

// sawConn records the address c is connected to (see sawRemote).
func (kc *keyCap) sawConn(c *conn) {
	if a, ok := c.raw.RemoteAddr().(*net.TCPAddr); ok {
		kc.sawRemote(a.AddrPort())
	}
}

// lingering counts the host's connections of key that their processes have
// closed, or died holding, and the upstream has not closed: it still counts
// them against any limit of its own, and a dead process's budget stays held
// for them (orbitpool.Pool.SetLingering). -1 if it cannot tell: this process
// knows no address of key's upstream, or the kernel does not say.
func (n *Node) lingering(key orbitpool.Key) int {
	kc := n.capOf(key)
	if kc == nil {
		return -1
	}
	kc.remoteMu.Lock()
	addrs := slices.Clone(kc.remotes)
	kc.remoteMu.Unlock()
	if len(addrs) == 0 {
		return -1
	}
	c, err := sockdiag.Orphans(addrs)
	if err != nil {
		n.cannotCount(err)
		return -1
	}
	if now := sinceStart(time.Now()); c > 0 && now >= kc.lingerLogAt.Load() {
		kc.lingerLogAt.Store(now + int64(lingerLogEvery))
		n.log.Info("upstream still holds connections closed here; a dead process's share of the cap stays held",
			zap.Stringers("upstream", addrs), zap.Int("connections", c))
	}
	return c
}

// cannotCount logs, once, that the kernel will not say which connections an
// upstream still holds.
func (n *Node) cannotCount(err error) {
	n.lingerErr.Do(func() {
		n.log.Warn("cannot count the connections an upstream has not closed; a dead process's share of a cap is held for a set time only, and a refused connection is any failed one", zap.Error(err))
	})
}

// lingerLogEvery is how often lingering logs a key's connections still held
// open by its upstream, which it is asked about every 100ms while they are.
const lingerLogEvery = 10 * time.Second
