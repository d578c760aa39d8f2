// Command barehop is proxybench's bare forwarding hop: the smallest
// faithful sidecar proxy, against which ctrlmesh-proxy's overhead is put in
// proportion. It serves plain HTTP/1.1 on a loopback address, as
// ctrlmesh-proxy serves the benchmark's clients, and forwards every request
// to the API server of a kubeconfig through proxy.UpstreamReverseProxy —
// ctrlmesh-proxy's own forwarding (HTTP/1.1 over TLS, its idle pool, its
// buffer pool) — with nothing in between: no rules, no sharding, no checks.
// What it costs over direct requests is what any sidecar's extra hop costs
// on the machine.
//
// It is built and started by proxybench, as ctrlmesh-proxy is, and ends on
// SIGTERM.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/ctrlmesh/ctrlmesh/proxy"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "barehop:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("barehop", flag.ContinueOnError)
	kubeconfig := fs.String("upstream-kubeconfig", "", "kubeconfig of the API server to forward to (required)")
	listen := fs.String("listen-address", "", "loopback address to serve plain HTTP on (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *kubeconfig == "" || *listen == "" || fs.NArg() > 0 {
		return errors.New("usage: barehop --upstream-kubeconfig=FILE --listen-address=HOST:PORT")
	}
	// Loaded as ctrlmesh-proxy loads --upstream-kubeconfig.
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: *kubeconfig}, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("--upstream-kubeconfig: %w", err)
	}
	forward, err := proxy.UpstreamReverseProxy(cfg)
	if err != nil {
		return err
	}
	// Requests the benchmark cuts short at the end of each concurrent run
	// are expected; ctrlmesh-proxy logs them only at V(1).
	forward.ErrorLog = log.New(io.Discard, "", 0)
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "serving on %s, forwarding to %s\n", l.Addr(), cfg.Host)
	// The server ctrlmesh-proxy serves the operator with (proxy.Run).
	return (&http.Server{Handler: forward, ReadHeaderTimeout: 10 * time.Second}).Serve(l)
}
