package governor

// waiter is a caller parked because no worker was free. granted is written
// under Governor.mu before ready is closed.
type waiter struct {
	want, per  uint64
	granted    uint64
	ready      chan struct{}
	prev, next *waiter
}

// waitQueue is an intrusive FIFO, so that a waiter that gives up can leave
// from the middle in constant time.
type waitQueue struct {
	head, tail *waiter
}

func (q *waitQueue) push(w *waiter) {
	w.prev = q.tail
	if q.tail == nil {
		q.head = w
	} else {
		q.tail.next = w
	}
	q.tail = w
}

func (q *waitQueue) remove(w *waiter) {
	if w.prev == nil {
		q.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		q.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.prev, w.next = nil, nil
}
