// Command pause is the sandbox (infrastructure) container of the test bed's node: it holds a pod's
// namespaces open, reaps the zombies handed to it as PID 1, and exits on SIGINT or SIGTERM. The test
// bed packs it into a one-file image because no registry is reachable for the upstream one.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
