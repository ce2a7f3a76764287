// Package freeport picks TCP ports for servers that start later, in another
// process or from a configuration: the fleet of a scenario, a Caddy that a
// test configures.
//
// A port the kernel hands out for "127.0.0.1:0" comes from its ephemeral
// range, the range it also gives outgoing connections their local ports
// from. Closed and bound again later, it is free only until then: a test
// run that makes thousands of connections a second can take it meanwhile,
// and the server that binds it fails with "address already in use". So Pick
// chooses below (or above) that range, where only an explicit bind takes a
// port.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// rangeFile is the kernel's ephemeral port range, "low high".
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// lowest is the least port Pick chooses: below it are well-known services'.
const lowest = 10000

// Pick returns a port on which nothing listens or is bound, on any address,
// as it returns. It tries random ports outside the ephemeral range; where
// the range leaves too few (or cannot be read), it takes one the kernel
// gives, as before.
func Pick() (int, error) {
	lo, hi := ephemeralRange()
	var spans [][2]int
	if lo-lowest >= 1000 {
		spans = append(spans, [2]int{lowest, lo - 1})
	}
	if 65535-hi >= 1000 {
		spans = append(spans, [2]int{hi + 1, 65535})
	}
	if len(spans) == 0 {
		return kernelPort()
	}
	var last error
	for range 64 {
		s := spans[rand.IntN(len(spans))]
		port := s[0] + rand.IntN(s[1]-s[0]+1)
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			last = err
			continue
		}
		ln.Close()
		return port, nil
	}
	return 0, fmt.Errorf("freeport: no free port outside the ephemeral range %d-%d in 64 tries: %w", lo, hi, last)
}

// ephemeralRange reads the kernel's ephemeral range; without it, the whole
// range of ports is taken as ephemeral.
func ephemeralRange() (lo, hi int) {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 0, 65535
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 65535
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err := errors.Join(err1, err2); err != nil || lo > hi {
		return 0, 65535
	}
	return lo, hi
}

// kernelPort is a port the kernel gives for 127.0.0.1:0, free when it
// returns.
func kernelPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
