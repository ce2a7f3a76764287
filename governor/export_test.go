package governor

// waiting is the number of queued waiters, so tests can tell that a caller
// has blocked without sleeping.
func (g *Governor) waiting() int { return int(g.state.Load() >> 32) }
