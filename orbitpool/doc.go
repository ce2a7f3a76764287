// Package orbitpool is the fleet's pool table: a record of every resource
// (typically an upstream connection) that any process of a fleet owns, kept in
// one shared-memory segment so that every process can see, reserve and wait
// for the resources of every other.
//
// A resource is owned by one process and used by others through it. The owner
// registers it under a [Key] with a capacity. Any process reads the
// [Pool.Candidates] for a key and [Pool.Reserve]s capacity on one with a
// single compare-and-swap, receiving a [Lease] or [ErrBusy]. A lease is plain
// numbers: it crosses processes, and the owner validates it against the slot in
// [Pool.Accept] before it does the work. The [Execution] that Accept returns is
// the only way capacity comes back: a caller that gives up frees nothing, and a
// reservation its owner never saw is aged out by the owner's [Pool.Reconcile].
//
// [Pool.ClaimCreate] hands out a key's creation budget, counting live and
// in-progress resources together across the whole fleet, so a fleet that finds
// a key empty does not create everything at once. [Pool.Acquire] combines the
// steps under a [Policy] ([LocalFirst] by default) and parks the caller on the
// key when nothing can be had, until capacity returns anywhere in the fleet or
// its context ends.
//
// # Memory layout and concurrency
//
// The segment is a file (normally under /dev/shm) mapped MAP_SHARED by every
// process, or anonymous memory for a standalone pool; the same code runs over
// both. It holds a header (magic, ABI version, spec and a checksum), one lane
// per process, a key table, per-lane key lists and counters, and the resource
// slots, each lane owning its own slots. All shared words are 8-byte aligned
// and touched only through sync/atomic; no Go pointer is ever stored there.
//
// A slot's state, generation, users and pending reservations live in one
// 64-bit word, so Reserve, Accept and Complete are each one compare-and-swap
// on it. The generation is 36 bits, carried in every [ResourceID] and [Lease]:
// a slot that is freed and reused changes generation, so a stale lease can never
// be accepted (it would have to outlive 2^36 reuses of one slot).
//
// A slot's key and capacity are written while it is free or being created, so
// a reader takes them as the resource's only between two loads of the word
// that show the same live generation, and every operation that follows
// requires that generation in its compare-and-swap. Slots move between keys
// all the time (the free list is LIFO); this is what keeps a key's
// acquisition from ever being handed another key's resource.
//
// Structural changes (a process joining, a key first named, reclaiming a dead
// process) are rare and serialised by an open-file-description lock on the
// segment file, which operations that change a key's counters and a slot
// together (create, register, unregister) hold shared, so a reclaim never sees
// half of one. OFD locks give a waiting writer no priority, so a writer polls
// and keeps a fresh intent word in the header, to which new readers in every
// process defer: naming a key or joining takes milliseconds, not seconds, while
// other processes churn connections. Each process also holds an OFD lock on its lane's byte for its
// whole life: the kernel drops it when the process dies however it dies, so the
// survivors learn of a death from the OS, not from a missed heartbeat, and
// reclaim everything the dead process held.
//
// # Waiting
//
// Each lane has a doorbell word. A waiter registers on its key (a per-key
// bitmask of lanes with waiters), re-checks, then sleeps on a channel. Whoever
// returns capacity bumps the key's wake sequence and rings the doorbell of each
// lane in the mask; one dispatcher goroutine per process sleeps on its doorbell
// with a futex and wakes as many local waiters as units came back. No goroutine
// polls and no OS thread is blocked per waiter.
//
// # Guards
//
// An [Execution] or [CreationPermit] that its caller drops without releasing
// gives its unit back when the garbage collector finds it, is counted in
// [Pool.LeakedGuards] and is reported to [Options.OnError] as [ErrLeakedGuard].
// Executions are carved from batches with one cleanup each, so the net costs the
// hot path no allocation of its own.
//
// # Benchmarks
//
//	go test -run '^$' -bench 'ReserveAccept|Acquire|Wake|IdleWaiters' -benchmem ./orbitpool/
//
// measures Reserve/Accept/Complete over process memory and a shared segment,
// uncontended and contended from two processes, Acquire with LocalFirst over 64
// keys of 16 resources, and the cross-process wake latency (reported as p50 and
// p99 metrics).
//
//	go test -run '^$' -bench StructuralOps -benchtime 1x ./orbitpool/
//
// reports the p99 of naming a key, joining and reclaiming a dead lane while
// another process runs 8 goroutines of Register/Unregister, and
//
//	go test -run '^$' -bench MultiProcessStress -benchtime 1x ./orbitpool/ [-orbitpool.stress 60s]
//
// runs the four-process stress (remote and local use, slots moving between
// keys, every execution's key checked) for a minute and reports its counts.
package orbitpool
