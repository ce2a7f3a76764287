package fleet

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// adv11Admin is adv9Admin whose loads from the holdAt-th on (1-based; 0:
// none) are answered only once hold is closed.
func adv11Admin(t *testing.T, sock string, refuse, holdAt int, hold <-chan struct{}) <-chan []byte {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	loads := make(chan []byte, 16)
	var n atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/load" {
			return
		}
		i := n.Add(1)
		loads <- b
		if i <= int64(refuse) {
			http.Error(w, "refused by the test", http.StatusBadRequest)
			return
		}
		if holdAt > 0 && i >= int64(holdAt) {
			select {
			case <-hold:
			case <-time.After(10 * time.Second):
			}
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return loads
}

func adv11Want(t *testing.T, loads <-chan []byte, who, v string) {
	t.Helper()
	b, ok := adv9Loaded(loads, 5*time.Second)
	if !ok || !strings.Contains(string(b), `"v":"`+v+`"`) {
		t.Fatalf("%s: want a load of v=%s, got %q (%v)", who, v, b, ok)
	}
}

// TestAdv11RetryDuringReloadDoesNotSpin: a retry of the workers that
// refused the fleet's configuration, due while a reload is under way, waits
// its turn again. A reload that every worker accepted in between reset the
// retry delay to 0: the retry must not then be re-armed at once, over and
// over, spinning the supervisor's loop for as long as the reload lasts.
func TestAdv11RetryDuringReloadDoesNotSpin(t *testing.T) {
	l := newAdv9Loop(t, 0, nil)
	s := l.s
	const retryMin = 400 * time.Millisecond
	s.retryMin = retryMin
	s.n = 2
	s.events = make(chan event, 64)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Skipf("no true(1) to stand for the workers' processes: %v", err)
	}
	dir := t.TempDir()
	hold := make(chan struct{})
	var released atomic.Bool
	release := func() {
		if released.CompareAndSwap(false, true) {
			close(hold)
		}
	}
	defer release()
	var admin [2]<-chan []byte
	for id := range 2 {
		w := &worker{
			id:      id,
			sock:    filepath.Join(dir, fmt.Sprintf("w%d.sock", id)),
			pidPath: filepath.Join(dir, fmt.Sprintf("w%d.pid", id)),
			gen:     1,
			token:   fmt.Sprintf("token-%d", id),
			proc:    gone.Process,
			running: true,
			ready:   true,
			started: time.Now(),
			cfgGen:  1,
		}
		refuse, holdAt := 0, 3 // worker 0 holds its third load
		if id == 1 {
			refuse, holdAt = 1, 0 // worker 1 refuses its first
		}
		admin[id] = adv11Admin(t, w.sock, refuse, holdAt, hold)
		s.workers = append(s.workers, w)
	}
	l.start()
	stopped := false
	defer func() {
		release()
		if !stopped {
			l.send(event{kind: evSignal, sig: syscall.SIGTERM})
			for id := range 2 {
				l.send(event{kind: evExited, id: id, gen: 1})
			}
			select {
			case <-l.done:
			case <-time.After(10 * time.Second):
				t.Error("the supervisor's loop did not end")
			}
		}
	}()
	reload := func(v string) {
		t.Helper()
		if err := os.WriteFile(s.configFile, []byte(`{"apps":{"v":"`+v+`"}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		l.send(event{kind: evSignal, sig: syscall.SIGHUP})
	}
	// Reload 2: worker 0 accepts, worker 1 refuses: a retry is due in
	// retryMin.
	reload("2")
	adv11Want(t, admin[0], "worker 0", "2")
	adv11Want(t, admin[1], "worker 1", "2")
	// Reload 3: both accept (the retry delay goes back to 0; the retry is
	// still due). Reload 4: worker 0 holds its answer past the retry.
	reload("3")
	adv11Want(t, admin[0], "worker 0", "3")
	adv11Want(t, admin[1], "worker 1", "3")
	reload("4")
	adv11Want(t, admin[0], "worker 0", "4")
	adv11Want(t, admin[1], "worker 1", "4")

	// Count the retries the loop sees while reload 4 is under way, taking
	// each event from the queue and putting it back.
	var retries int
	end := time.Now().Add(3 * retryMin)
	for time.Now().Before(end) {
		select {
		case ev := <-s.events:
			if ev.kind == evRetryRefused {
				retries++
			}
			s.events <- ev
		case <-time.After(5 * time.Millisecond):
		}
	}
	release()
	if retries > 4 {
		t.Errorf("the loop saw %d retry events in %s while a reload was under way; want at most one every %s", retries, 3*retryMin, retryMin)
	}
	// The fleet still settles: stop it.
	l.send(event{kind: evSignal, sig: syscall.SIGTERM})
	for id := range 2 {
		l.send(event{kind: evExited, id: id, gen: 1})
	}
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the supervisor's loop did not end after a stop")
	}
	stopped = true
}
