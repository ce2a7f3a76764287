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
// how capacity comes back. A reserver that could not deliver its lease
// [Pool.Withdraw]s it, which frees the unit unless the owner accepted it
// already; a reservation its owner never saw and that was not withdrawn (its
// reserver died) is aged out by the owner's [Pool.Reconcile]. Accept and
// Withdraw each take the lease's ticket, leaving their own claim in its place
// until they have acted on the reservation, so that a process held up
// between the two steps, however long, acts on its own reservation and not on
// a newer one of the same slot; Reconcile finishes the claims of a process
// that died.
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
// per process, a key table and its hash index, per-lane key lists, queue words
// and counters, and the resource slots, each lane owning its own slots. All shared words are 8-byte aligned
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
// reclaim everything the dead process held. A process may die between two
// steps of an operation: the reclaim recounts every key from the slots, and
// restores the hints it may have left unwritten (finishDeadSteps): room bits,
// and room on a key's resources that its waiters were never told of. A unit
// of a key's budget given back just before such a death is marked as
// returning until its waiters are woken (slReturning), and the reclaim wakes
// them for it. A key a collector died half-way through collecting is taken
// back, in the generation its waiters watch, when it is next named
// (reviveKey). What a second death during the reclaim itself leaves undone
// (a key recounted and not yet woken) is not redone: those waiters are served
// as the key's other units come back, or at their deadline.
//
// # Waiting
//
// Waiters on a key are served in the order they arrived, across the fleet.
// A waiter takes a ticket from the key's counter, joins its process's queue
// for the key (in ticket order) and sets its lane's bit in the key's waiter
// mask. Each lane publishes, per key, how many of its waiters wait, the
// tickets of its three oldest, and that of its oldest waiter handed a unit it
// has not yet taken. Whoever returns a unit of capacity hands it to
// the lane whose next waiter is the oldest of the fleet, by adding a grant to
// that lane's queue word, and rings the lane's doorbell; one dispatcher
// goroutine per process sleeps on its doorbell with a futex and delivers each
// grant to its oldest waiter, by channel. No goroutine polls and no OS thread
// is blocked per waiter.
//
// While any process has a waiter on a key, a newcomer does not take what
// comes back: it queues behind. A waiter tries for capacity when it is handed
// a unit, or when no waiting waiter in the fleet is older (it checks that
// once, after it has published itself, so that a unit returned while it was
// registering is not lost). A waiter that finds nothing after all keeps its
// ticket and so its place; one that gives up (its context ends, or it fails)
// passes an undelivered unit on to the next oldest. Reclaiming a dead
// process's lane hands the units it had been given, and one more for the
// waiter it may have been about to serve, to the others.
//
// A waiter that is not eligible also defers to an older one that was handed a
// unit and has not taken it. Units that came back while every waiter had one
// on its way are counted on the key as unclaimed, and a waiter that defers to
// grants takes one of those instead; and a waiter that found capacity nobody
// handed it has the next waiter look too, so a unit returned while waiters
// were still registering is never left idle behind a sleeping queue.
//
// A process may keep the room a use of its own resource gives back for its
// own oldest waiter, when that one is at most [Options.OrderWindow] tickets
// younger than the fleet's oldest: no waiter is then passed by one more than
// the window younger, and a turn that stays in the process spares two
// processes a wake-up and the waiter's relay through the owner. Creation
// budget goes in strict order, so the process whose waiters wait longest
// creates the next resource, except that a process that holds more than its
// share may unregister a resource, or give up a creation permit, toward a
// sibling that waits while holding fewer ([Pool.Neediest],
// [Pool.UnregisterToward], [CreationPermit.CloseToward]): that sibling's
// oldest waiter gets the unit if it is within the same window. The window is
// 0, strict order, unless the embedder sets it.
//
// What is not strict: some returns are announced as more units than there may
// be (a waiter that found capacity nobody handed it has the next waiter look
// too, a closed Readiness passes one on, a reclaimed lane hands on one more
// than it was given). A grantee that then finds nothing keeps its ticket and
// is first for the next unit, but a unit that came back while its grant was on
// its way has gone to a younger waiter; and such units that find no waiter
// are counted as unclaimed, which a waiter deferring to a grant may take,
// until the key's last waiter leaves. And a lane publishes only its three
// oldest tickets: while a sibling's dispatcher has not yet delivered three or
// more grants, a return of several units at once (a capacity raised, a lane
// reclaimed) ranks that lane by its third waiter, which can pass a waiter
// elsewhere by the lane's undelivered grants. A process delivers its own
// lane's grants at once.
//
// # Finding a key and a sibling's room
//
// Keys are found through a hash index of a power of two at least four times
// the key table, each entry the record's index and a tag of the key's hash.
// A key is placed within 64 entries of its hash and a look-up never reads
// further, so hits and misses cost a few entries at any fill the spec allows,
// tombstones included (those an empty entry follows are swept when keys are
// collected). The hash is keyed by a random seed each segment draws, which
// only the fleet's user can read: names cannot be chosen to crowd one
// stretch of the index.
//
// Each key also has a room mask: a bit per lane that may have a resource of
// the key with room: a unit neither used nor reserved, whether or not one of
// its reservation bits is free (the owner's own uses take none). An owner
// sets its bit when it gives a unit back or
// registers a resource; a process that walks a lane's list and finds no room
// clears the bit and walks it once more, setting the bit back if it then finds
// room, so a bit is never left clear over a resource with room. LocalFirst
// walks only the lanes the mask names, so finding a sibling's free resource
// costs the lanes with room, not the fleet; its own lane's bit spares the
// walk of its own list when it is full.
//
// A process whose lane has no free slot can use only a sibling's resource,
// and cannot wait in the key's queue for one without holding up younger
// waiters that could create. It watches the key instead ([Pool.WatchRoom]):
// a third mask names the lanes watching, and an owner giving back a unit of
// a watched key adds to the key's room count and rings the watching lanes,
// whose dispatchers wake the watches the count has passed. A watch takes no
// ticket, but holds its key's entry as a waiter does: a watched entry is not
// collected for another key. With no lane watching, giving a unit back costs
// one more load of the line the other masks are on.
//
// # Lanes
//
// A segment has at most MaxLanes (256) lanes; the default spec has
// DefaultLanes (64). A key's masks take one word per 64 lanes. A process that
// finds every lane taken is told to raise PoolSpec.Lanes.
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
//	go test -run '^$' -bench 'ReserveAccept|Acquire|Wake|IdleWaiters|KeyLookup|WaitQueue' -benchmem ./orbitpool/
//
// measures Reserve/Accept/Complete over process memory and a shared segment,
// uncontended and contended from two processes, Acquire with LocalFirst over 64
// keys of 16 resources, Acquire finding the one free resource of 64 lanes × 16
// on the last lane (BenchmarkRemoteAcquire, with the owner's Accept and
// Complete), look-ups in a default-size key table 25, 50, 90 and 100% full
// (hit, miss, and the slowest key), the cross-process wake latency
// (reported as p50 and p99 metrics), and a capped key's hand-off with 4, 64
// and 1024 goroutines of one process waiting (BenchmarkWaitQueue: a
// hand-off walks only the oldest few of a key's local waiters).
//
//	go test -run '^$' -bench MultiProcessFairness -benchtime 1x ./orbitpool/ [-orbitpool.fair 10s]
//
// runs 4 processes × 16 goroutines on a key capped at 16 units (held 0.5 to
// 2.5 ms, one acquisition in ten with a deadline of a few milliseconds) and
// reports the wait p50/p99/max, how far service order strays from arrival
// order (rank displacement p99 and max) and the share of acquisitions served
// after one that arrived 5 ms later.
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
//
// To compare with another commit, build both test binaries (go test -c) and
// run them one after the other with the same -test.bench pattern and
// -test.count.
package orbitpool
