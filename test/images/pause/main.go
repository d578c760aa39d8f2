// Command pause is the sandbox ("pause") image of the test nodes' containerd
// and an idle container for tests: it waits for SIGTERM or SIGINT and exits
// 0, as registry.k8s.io/pause does, so that no registry is needed.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
}
