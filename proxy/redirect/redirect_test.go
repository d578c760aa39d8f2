package redirect

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

func TestParseDestination(t *testing.T) {
	for _, tt := range []struct {
		in, want, err string
	}{
		{in: "10.96.0.1:443", want: "10.96.0.1:443"},
		{in: "[10.96.0.1]:6443", want: "10.96.0.1:6443"},
		{in: "$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)", err: "is not an IP address (is $(KUBERNETES_SERVICE_HOST) set?)"},
		{in: "10.96.0.1:$(KUBERNETES_SERVICE_PORT)", err: "is not a port"},
		{in: "fd00::1:443", err: "only IPv4"},
		{in: "[fd00::1]:443", err: "only IPv4"},
		{in: "kubernetes.default.svc:443", err: "is not an IP address"},
		{in: "10.96.0.1", err: "want address:port"},
		{in: "10.96.0.1:0", err: "is not a port"},
		{in: "10.96.0.1:65536", err: "is not a port"},
		{in: "", err: "want address:port"},
	} {
		got, err := ParseDestination(tt.in)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%q: %v, %v; want an error containing %q", tt.in, got, err, tt.err)
		case tt.err == "" && (err != nil || got.String() != tt.want):
			t.Errorf("%q: %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

// FuzzParseDestination: whatever it accepts is an IPv4 address with a
// port, written back as it parses again.
func FuzzParseDestination(f *testing.F) {
	for _, s := range []string{"10.96.0.1:443", "[1.2.3.4]:1", "fd00::1:443", "a:b", ":", "1.2.3.4:", "1.2.3.4%eth0:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDestination(s)
		if err != nil {
			return
		}
		if !d.Addr().Is4() || d.Port() == 0 || d.Addr().Zone() != "" {
			t.Fatalf("%q parsed as %v", s, d)
		}
		if again, err := ParseDestination(d.String()); err != nil || again != d {
			t.Fatalf("%q: %v does not parse back: %v, %v", s, d, again, err)
		}
	})
}

func TestValidate(t *testing.T) {
	good := Options{Destinations: []netip.AddrPort{netip.MustParseAddrPort("10.96.0.1:443")}, ToPort: 15080, ExcludeUserID: 15080}
	for name, tt := range map[string]struct {
		edit func(*Options)
		err  string
	}{
		"good":           {func(*Options) {}, ""},
		"no destination": {func(o *Options) { o.Destinations = nil }, "no destination"},
		"loopback":       {func(o *Options) { o.Destinations = []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:443")} }, "on loopback"},
		"no port":        {func(o *Options) { o.ToPort = 0 }, "port is needed"},
		"root excluded":  {func(o *Options) { o.ExcludeUserID = 0 }, "must not be root's"},
	} {
		o := good
		tt.edit(&o)
		err := o.Validate()
		if (tt.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.err)) {
			t.Errorf("%s: %v, want %q", name, err, tt.err)
		}
	}
}

// TestApplyRedirects programs the rules into a network namespace of its
// own, twice (an init container runs again when its pod's sandbox is
// recreated), and checks what they do there: a root process's connection
// to the destination reaches a listener on 127.0.0.1 at the proxy's port;
// the excluded user's goes to the destination (where nothing answers).
func TestApplyRedirects(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test makes a network namespace: run it as root")
	}
	ns := fmt.Sprintf("ctrlmesh-redirect-%d", os.Getpid())
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	// The destination is routed (a veth pair inside the namespace), as the
	// Service's ClusterIP is in a pod: without a route, connect fails
	// before netfilter.
	run("ip", "-n", ns, "link", "set", "lo", "up")
	run("ip", "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
	run("ip", "-n", ns, "addr", "add", "10.99.0.2/24", "dev", "v0")
	run("ip", "-n", ns, "link", "set", "v0", "up")

	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Destinations: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:443")}, ToPort: 15080, ExcludeUserID: 15080}
	for range 2 {
		if err := Apply(conn, opts); err != nil {
			t.Fatal(err)
		}
	}
	listing := run("ip", "netns", "exec", ns, "nft", "list", "ruleset")
	for _, want := range []string{"table ip ctrlmesh-redirect", "type nat hook output priority", "meta skuid 15080 return",
		"ip daddr 10.99.0.1 tcp dport 443 dnat to 127.0.0.1:15080"} {
		if !strings.Contains(listing, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, listing)
		}
	}
	if n := strings.Count(listing, "dnat to"); n != 1 {
		t.Errorf("%d DNAT rules after two runs, want 1:\n%s", n, listing)
	}

	// The proxy's stand-in, listening in the namespace.
	listener := make(chan net.Listener, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread stays in the namespace and ends with the goroutine
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		l, err := net.Listen("tcp", "127.0.0.1:15080")
		if err != nil {
			errc <- err
			return
		}
		listener <- l
	}()
	var l net.Listener
	select {
	case l = <-listener:
	case err := <-errc:
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("proxy\n"))
			_ = c.Close()
		}
	}()
	dial := "exec 3<>/dev/tcp/10.99.0.1/443 && head -n1 <&3"
	out, err := exec.Command("ip", "netns", "exec", ns, "timeout", "5", "bash", "-c", dial).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "proxy" {
		t.Errorf("root's connection to 10.99.0.1:443: %v %q, want the proxy's answer", err, out)
	}
	out, err = exec.Command("ip", "netns", "exec", ns, "setpriv", "--reuid=15080", "--regid=15080", "--clear-groups",
		"timeout", "2", "bash", "-c", dial).CombinedOutput()
	if err == nil || strings.Contains(string(out), "proxy") {
		t.Errorf("the excluded user's connection to 10.99.0.1:443 reached the proxy: %v %q", err, out)
	}
}
