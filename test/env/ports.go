package env

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// Ports handed out by FreePort lie below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range, 32768–60999 by default). A port the
// kernel picked for "127.0.0.1:0" and that the test then closed goes back
// to that range, where the next outgoing connection of any process — a
// client to one of the API servers, which tests open by the hundred — may
// take it as its local port before the component under test binds it; the
// hub's metrics server then failed with "address already in use". Below
// the range only another listener can hold a port, and FreePort checks that.
const (
	portsFrom = 20000
	portsTo   = 32768 // the default ephemeral range's first port
)

// FreeAddress returns "127.0.0.1:<port>" with a port nothing listened on
// a moment ago and that no outgoing connection takes meanwhile.
func FreeAddress() (string, error) {
	for range 100 {
		port := portsFrom + rand.IntN(portsTo-portsFrom)
		address := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		l, err := net.Listen("tcp", address)
		if err != nil {
			continue // taken by a listener of another test; try another
		}
		if err := l.Close(); err != nil {
			return "", err
		}
		return address, nil
	}
	return "", fmt.Errorf("no free port in [%d, %d) after 100 tries: check what listens on 127.0.0.1 (ss -ltn)", portsFrom, portsTo)
}

// FreePort is FreeAddress's port, failing t when there is none.
func FreePort(t testing.TB) int {
	t.Helper()
	address, err := FreeAddress()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(address)
	n, _ := strconv.Atoi(port)
	return n
}
