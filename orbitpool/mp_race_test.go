//go:build race

package orbitpool

// mpRace reports a race-detector build: the multi-process tests scale their
// counts and durations down under it.
const mpRace = true
