package scenario

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The peers: other proxies run in front of the same upstream under the same
// load, configured as close to the scenario as each allows.
const (
	Nginx   Variant = "nginx"
	HAProxy Variant = "haproxy"
)

// Peers are the peer variants whose program is on PATH.
func Peers() []Variant {
	var out []Variant
	for _, v := range []Variant{Nginx, HAProxy} {
		if _, err := exec.LookPath(string(v)); err == nil {
			out = append(out, v)
		}
	}
	return out
}

// Proxy is what a scenario's During step can do to the proxy under load.
type Proxy interface {
	// Reload reloads the proxy's configuration gracefully.
	Reload() error
	// KillWorker kills one worker process with SIGKILL and returns its
	// pid; the proxy is expected to start another.
	KillWorker(i int) (int, error)
	// PID is the process that starts the workers (a supervisor or a
	// master), whose tree's CPU time the row reports.
	PID() int
	Stop() error
}

var _ Proxy = (*Fleet)(nil)

// peer is a running nginx or HAProxy.
type peer struct {
	v      Variant
	cmd    *exec.Cmd
	log    bytes.Buffer
	exited chan error
}

// startPeer runs variant v in front of upstreamURL on port, with workers
// processes (nginx) or threads (HAProxy), and waits until it listens.
func startPeer(ctx context.Context, v Variant, s Scenario, port int, upstreamURL string, workers int, dir string) (*peer, error) {
	u, err := url.Parse(upstreamURL)
	if err != nil {
		return nil, err
	}
	tls := u.Scheme == "https"
	p := &peer{v: v, exited: make(chan error, 1)}
	cfg := filepath.Join(dir, string(v)+".conf")
	switch v {
	case Nginx:
		err = os.WriteFile(cfg, []byte(nginxConfig(s, port, u.Host, tls, workers, dir)), 0o600)
		p.cmd = exec.Command("nginx", "-c", cfg, "-p", dir, "-e", filepath.Join(dir, "nginx-error.log"))
	case HAProxy:
		err = os.WriteFile(cfg, []byte(haproxyConfig(s, port, u.Host, tls, workers)), 0o600)
		// Master-worker mode: SIGUSR2 to the master reloads.
		p.cmd = exec.Command("haproxy", "-W", "-db", "-f", cfg)
	default:
		return nil, fmt.Errorf("no peer %q", v)
	}
	if err != nil {
		return nil, err
	}
	p.cmd.Stdout, p.cmd.Stderr = &p.log, &p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", v, err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return p, nil
		}
		select {
		case err := <-p.exited:
			p.exited <- err
			return nil, fmt.Errorf("%s exited while starting (%v):\n%s", v, err, p.log.String())
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("%s not listening after 20s:\n%s", v, p.log.String())
		}
	}
}

// nginxConfig keeps idle upstream connections per worker (as nginx does)
// and caps them with max_conns in a shared zone, which makes the cap count
// every worker's connections; nginx without NGINX Plus's queue answers 502
// when the cap is reached.
func nginxConfig(s Scenario, port int, upstream string, tls bool, workers int, dir string) string {
	maxConns := ""
	if s.MaxConns > 0 {
		maxConns = fmt.Sprintf(" max_conns=%d", s.MaxConns)
	}
	scheme, ssl := "http", ""
	if tls {
		scheme, ssl = "https", "\t\t\tproxy_ssl_verify off;\n\t\t\tproxy_ssl_session_reuse on;\n"
	}
	return fmt.Sprintf(`daemon off;
master_process on;
worker_processes %d;
pid %s;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path %s;
	proxy_temp_path %s;
	upstream u {
		zone u 64k;
		server %s%s;
		keepalive 1024;
	}
	server {
		listen 127.0.0.1:%d reuseport;
		location / {
			proxy_pass %s://u;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_request_buffering off;
			proxy_buffering off;
%s		}
	}
}
`, workers, filepath.Join(dir, "nginx.pid"), filepath.Join(dir, "body"), filepath.Join(dir, "proxy"),
		upstream, maxConns, port, scheme, ssl)
}

// haproxyConfig runs one process with a thread per worker; a server's
// maxconn queues requests past it, for up to the load's timeout, as orbit's
// waiters do.
func haproxyConfig(s Scenario, port int, upstream string, tls bool, workers int) string {
	maxConn := ""
	if s.MaxConns > 0 {
		maxConn = fmt.Sprintf(" maxconn %d", s.MaxConns)
	}
	ssl := ""
	if tls {
		ssl = " ssl verify none"
	}
	return fmt.Sprintf(`global
	nbthread %d
	maxconn 8192
defaults
	mode http
	timeout connect 5s
	timeout client 30s
	timeout server 30s
	timeout queue 10s
	http-reuse always
frontend f
	bind 127.0.0.1:%d
	default_backend b
backend b
	server s %s%s%s
`, workers, port, upstream, maxConn, ssl)
}

// Reload asks the peer to reload its configuration gracefully.
func (p *peer) Reload() error {
	switch p.v {
	case Nginx:
		return p.cmd.Process.Signal(syscall.SIGHUP)
	default:
		return p.cmd.Process.Signal(syscall.SIGUSR2)
	}
}

// KillWorker kills nginx's i-th worker process. HAProxy runs its threads in
// one worker process, whose death would take every request with it, so
// nothing is killed there.
func (p *peer) KillWorker(i int) (int, error) {
	if p.v != Nginx {
		return 0, errNoWorker
	}
	out, err := exec.Command("pgrep", "-P", strconv.Itoa(p.cmd.Process.Pid)).Output()
	if err != nil {
		return 0, fmt.Errorf("listing nginx workers: %w", err)
	}
	pids := strings.Fields(string(out))
	if i >= len(pids) {
		return 0, fmt.Errorf("nginx has %d workers, no worker %d", len(pids), i)
	}
	pid, err := strconv.Atoi(pids[i])
	if err != nil {
		return 0, err
	}
	return pid, syscall.Kill(pid, syscall.SIGKILL)
}

// errNoWorker is a KillWorker on a proxy with no worker process of its own
// to kill.
var errNoWorker = errors.New("no separate worker process to kill")

// Stop stops the peer and every process of it.
func (p *peer) PID() int { return p.cmd.Process.Pid }

func (p *peer) Stop() error {
	pgid := p.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case err := <-p.exited:
		p.exited <- err
		return nil
	case <-time.After(10 * time.Second):
	}
	syscall.Kill(-pgid, syscall.SIGKILL)
	err := <-p.exited
	p.exited <- err
	return fmt.Errorf("%s did not stop within 10s", p.v)
}
