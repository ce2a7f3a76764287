package fleet

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "orbit-fleet",
		Usage: "[--config <path> [--adapter <name>]] [--workers <n>] [--run-dir <dir>] [--pidfile <file>] [--stop-timeout <duration>] [--handover]",
		Short: "Runs a fleet of Caddy workers on one port, sharing upstream connections",
		Long: `
Runs N Caddy workers of this binary with one configuration, on the same
ports, and an orbit_pool transport in the configuration makes them share
their upstream connections.

For each TCP address the configuration's HTTP servers listen on, the fleet
opens one SO_REUSEPORT socket per worker slot and hands it to that slot's
worker, and later to the worker that replaces it. The kernel spreads clients
evenly over the sockets, and since the fleet holds every socket for its whole
life, a worker that reloads, crashes or restarts resets none of the
connections waiting to be accepted. HTTP/3 (UDP) is bound by each worker with
SO_REUSEPORT. Addresses a reload adds are bound by each worker until the
fleet restarts; the fleet's sockets of an address a reload drops are closed,
and the address is bound by each worker if a later reload brings it back.

The fleet refuses to start on an address another process already listens on
(with SO_REUSEPORT the two would silently split the clients), unless
--handover says it is meant to: a new fleet starting beside the old one it
replaces, which is then stopped. Fleets on other addresses may share a pool
segment; each worker logs the processes of other fleets it finds there.

Each worker gets its own admin endpoint, a unix socket in the run directory
(reached as worker-<i>.sock, a link to the socket of this run of the fleet),
and persist_config off; the configuration's own admin
address is replaced (a configuration with 'admin off' is refused: reloads
need the admin endpoint). Workers see ORBIT_FLEET_WORKER (their index) and
ORBIT_FLEET_WORKERS in their environment.

A worker that exits is started again, after a delay that doubles from 100ms
to 10s while it keeps failing. SIGHUP reloads the configuration file into
every worker (gracefully, through its admin endpoint). A configuration that
every worker refuses leaves the fleet on the one it runs, which a worker
that restarts also gets; one that some workers accept becomes the fleet's,
and those that refused it are asked again after 1s, then 2s, up to every
30s, until they accept; a worker that was starting during a reload gets the
new configuration once it is ready. SIGTERM or SIGINT stops
the fleet listening and every worker gracefully, killing those still running
after --stop-timeout.

The run directory (default: $RUNTIME_DIRECTORY, else $XDG_RUNTIME_DIR/orbit-fleet,
else a directory in the system temp directory) holds the workers' admin
sockets, their configurations and pid files, and a lock that keeps two fleets
out of one directory. It is created 0700; an existing one is used only if it
belongs to this user and no one else may open it, and nothing in it is
written through a symlink. The segment's socket directory is held to the same
rule. Run as root, or on a host with other users, give the fleet a directory
of its own: systemd's RuntimeDirectory= (as in the unit below), or --run-dir
on a path only the fleet's user can reach.

A systemd template unit, caddy-fleet@.service, for /etc/caddy/<name>.Caddyfile:

	[Service]
	Type=simple
	User=caddy
	Group=caddy
	RuntimeDirectory=caddy-fleet-%i
	ExecStart=/usr/bin/caddy orbit-fleet --workers 4 --config /etc/caddy/%i.Caddyfile
	ExecReload=/bin/kill -HUP $MAINPID
	KillMode=mixed
	TimeoutStopSec=70s
	LimitNOFILE=1048576
	AmbientCapabilities=CAP_NET_BIND_SERVICE
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().StringP("config", "c", "", "Configuration file")
			cmd.Flags().StringP("adapter", "a", "", "Name of config adapter to apply")
			cmd.Flags().IntP("workers", "w", 2, "Number of worker processes")
			cmd.Flags().String("run-dir", "", "Directory for the workers' admin sockets and configurations")
			cmd.Flags().String("pidfile", "", "Path of a file to write the fleet's process ID to")
			cmd.Flags().Duration("stop-timeout", 60*time.Second, "How long workers may take to stop gracefully")
			cmd.Flags().Duration("start-timeout", 60*time.Second, "How long workers may take to load the configuration at startup")
			cmd.Flags().Bool("handover", false, "Start even if another process listens on the configuration's addresses, to take over from it")
			cmd.RunE = caddycmd.WrapCommandFuncForCobra(cmdOrbitFleet)
		},
	})
}

func cmdOrbitFleet(fl caddycmd.Flags) (int, error) {
	n := fl.Int("workers")
	if n < 1 || n > 64 {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("--workers must be between 1 and 64, got %d", n)
	}
	exe, err := os.Executable()
	if err != nil {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("finding this executable: %w", err)
	}
	runDir := fl.String("run-dir")
	if runDir == "" {
		runDir = defaultRunDir()
	}
	runDir, err = filepath.Abs(runDir)
	if err != nil {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("run directory: %w", err)
	}
	s := &supervisor{
		exe:          exe,
		configFile:   fl.String("config"),
		adapter:      fl.String("adapter"),
		n:            n,
		runDir:       runDir,
		stopTimeout:  fl.Duration("stop-timeout"),
		startTimeout: fl.Duration("start-timeout"),
		handover:     fl.Bool("handover"),
		pidfile:      fl.String("pidfile"),
		log:          caddy.Log().Named("orbit-fleet"),
	}
	if err := s.run(); err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	return caddy.ExitCodeSuccess, nil
}

// defaultRunDir is systemd's RuntimeDirectory when there is one, else a
// directory in the user's runtime directory or in the temp directory.
func defaultRunDir() string {
	if d := os.Getenv("RUNTIME_DIRECTORY"); d != "" {
		return filepath.SplitList(d)[0]
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "orbit-fleet")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("orbit-fleet-%d", os.Getuid()))
}
