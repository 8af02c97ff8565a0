// Command pause is the sandbox ("pause") image of the e2e's containerd
// (make images): it holds a pod's namespaces open until it is stopped.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
