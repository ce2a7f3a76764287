package scenario

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// BuildCaddy builds this module's Caddy (./cmd/caddy) into dir and returns
// the binary's path. The module root is found from the go command, so it
// works from any package directory.
func BuildCaddy(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside the orbit module: run from the repository")
	}
	bin := filepath.Join(dir, "caddy")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/caddy")
	cmd.Dir = filepath.Dir(gomod)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/caddy: %w\n%s", err, out)
	}
	return bin, nil
}

// Fleet is N Caddy workers on one port run by `caddy orbit-fleet`.
type Fleet struct {
	cmd    *exec.Cmd
	runDir string
	n      int
	log    bytes.Buffer
	exited chan error
}

// StartFleet runs `caddy orbit-fleet` with config (a Caddyfile) and waits
// until every worker's admin endpoint answers.
func StartFleet(ctx context.Context, caddy, config string, workers int, dir string) (*Fleet, error) {
	cfgPath := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		return nil, err
	}
	f := &Fleet{runDir: filepath.Join(dir, "run"), n: workers, exited: make(chan error, 1)}
	f.cmd = exec.Command(caddy, "orbit-fleet", "--workers", strconv.Itoa(workers),
		"--config", cfgPath, "--run-dir", f.runDir, "--stop-timeout", "10s")
	f.cmd.Stdout, f.cmd.Stderr = &f.log, &f.log
	f.cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	if err := f.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the fleet: %w", err)
	}
	go func() { f.exited <- f.cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for i := range workers {
		for !f.adminUp(i) {
			select {
			case err := <-f.exited:
				f.exited <- err
				return nil, fmt.Errorf("fleet exited while starting (%v):\n%s", err, f.Log())
			case <-ctx.Done():
				f.Stop()
				return nil, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				f.Stop()
				return nil, fmt.Errorf("worker %d not ready after 60s:\n%s", i, f.Log())
			}
		}
	}
	return f, nil
}

// Log is what the fleet printed.
func (f *Fleet) Log() string { return f.log.String() }

func (f *Fleet) adminUp(i int) bool {
	resp, err := f.Admin(i, "/config/")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Admin sends a GET to worker i's admin endpoint.
func (f *Fleet) Admin(i int, path string) (*http.Response, error) {
	return f.adminGet(i, path, 5*time.Second)
}

func (f *Fleet) adminGet(i int, path string, timeout time.Duration) (*http.Response, error) {
	sock := filepath.Join(f.runDir, fmt.Sprintf("worker-%d.sock", i))
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	defer c.CloseIdleConnections()
	return c.Get("http://localhost" + path)
}

// profile writes every worker's CPU profile over the next d (whole seconds,
// at least one) to dir, as name-worker-N.pprof.
func (f *Fleet) profile(dir, name string, d time.Duration) error {
	secs := max(1, int(d/time.Second))
	errs := make(chan error, f.n)
	for i := range f.n {
		go func() {
			resp, err := f.adminGet(i, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), time.Duration(secs)*time.Second+30*time.Second)
			if err != nil {
				errs <- fmt.Errorf("worker %d: %w", i, err)
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("worker %d: %s: %s", i, resp.Status, bytes.TrimSpace(b))
			}
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-worker-%d.pprof", name, i)), b, 0o644)
			}
			errs <- err
		}()
	}
	var all []error
	for range f.n {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// WorkerPID is the process ID of worker i, from its pid file.
func (f *Fleet) WorkerPID(i int) (int, error) {
	b, err := os.ReadFile(filepath.Join(f.runDir, fmt.Sprintf("worker-%d.pid", i)))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// KillWorker sends SIGKILL to worker i; the fleet starts it again.
func (f *Fleet) KillWorker(i int) (int, error) {
	pid, err := f.WorkerPID(i)
	if err != nil {
		return 0, err
	}
	return pid, syscall.Kill(pid, syscall.SIGKILL)
}

// Reload asks the fleet to reload its configuration into every worker.
func (f *Fleet) Reload() error { return f.cmd.Process.Signal(syscall.SIGHUP) }

// reuse reads, from worker 0's metrics, how many requests the fleet served
// on an open connection of their own worker and on a sibling's; false if the
// fleet does not use orbit_pool.
func (f *Fleet) reuse() (local, remote float64, ok bool) {
	err := f.metrics(0, "caddy_orbit_pool_fleet_reused_total{", func(line string, v float64) {
		switch {
		case strings.Contains(line, `where="remote"`):
			remote, ok = remote+v, true
		case strings.Contains(line, `where="local"`):
			local, ok = local+v, true
		}
	})
	return local, remote, ok && err == nil
}

// owned reads how many upstream connections each worker owns now.
func (f *Fleet) owned() ([]int, error) {
	n := make([]int, f.n)
	for i := range n {
		found := false
		err := f.metrics(i, "caddy_orbit_pool_owned_connections ", func(_ string, v float64) {
			n[i], found = int(v), true
		})
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fmt.Errorf("worker %d reports no caddy_orbit_pool_owned_connections", i)
		}
	}
	return n, nil
}

// total adds up the workers' values of a counter without labels.
func (f *Fleet) total(counter string) (int, error) {
	n, err := f.sum(counter)
	return int(n), err
}

// sum adds up the unlabelled metric name over the workers.
func (f *Fleet) sum(name string) (float64, error) {
	n := 0.0
	for i := range f.n {
		if err := f.metrics(i, name+" ", func(_ string, v float64) { n += v }); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// metrics calls fn with each of worker i's metric lines that start with
// prefix, and the line's value.
func (f *Fleet) metrics(i int, prefix string, fn func(line string, v float64)) error {
	resp, err := f.Admin(i, "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		j := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[j+1:], 64); err == nil {
			fn(line, v)
		}
	}
	return sc.Err()
}

// PID is the supervisor's process ID.
func (f *Fleet) PID() int { return f.cmd.Process.Pid }

// Stop stops the fleet gracefully, and kills it if it does not stop.
func (f *Fleet) Stop() error {
	f.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-f.exited:
		f.exited <- err
		return err
	case <-time.After(20 * time.Second):
	}
	// The supervisor did not stop: kill it and whatever workers it left.
	for i := range f.n {
		if pid, err := f.WorkerPID(i); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	f.cmd.Process.Kill()
	err := <-f.exited
	f.exited <- err
	return fmt.Errorf("fleet did not stop within 20s: %v", err)
}
