package env

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestFreeAddressBelowEphemeralRange: the ports handed out lie below the
// kernel's ephemeral range, where no outgoing connection takes them
// between the pick and the bind, and can be listened on. (Ports the kernel
// picks for "127.0.0.1:0", which tests used before, all lie inside it.)
func TestFreeAddressBelowEphemeralRange(t *testing.T) {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatalf("reading the ephemeral port range: %v", err)
	}
	from, err := strconv.Atoi(strings.Fields(string(data))[0])
	if err != nil {
		t.Fatal(err)
	}
	if from < portsTo {
		t.Fatalf("the ephemeral range starts at %d, below %d: FreeAddress's ports would overlap it; raise net.ipv4.ip_local_port_range", from, portsTo)
	}
	seen := map[string]bool{}
	for range 50 {
		address, err := FreeAddress()
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(address)
		n, _ := strconv.Atoi(port)
		if n < portsFrom || n >= from {
			t.Errorf("%s: port outside [%d, %d)", address, portsFrom, from)
		}
		l, err := net.Listen("tcp", address)
		if err != nil {
			t.Errorf("%s handed out but not free: %v", address, err)
			continue
		}
		seen[address] = true
		defer func() { _ = l.Close() }() // held, so later picks must avoid it
	}
	if len(seen) != 50 {
		t.Errorf("%d distinct free addresses of 50", len(seen))
	}
}
