// Command pause is the process of a pod sandbox: it holds the pod's namespaces open by doing
// nothing. It sleeps until SIGINT or SIGTERM (then exits 0) and, as PID 1 of a shared PID
// namespace, reaps every zombie child that is re-parented to it (on SIGCHLD).
//
// Static, no dependencies: CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags "-s -w".
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-v" || os.Args[1] == "--version") {
		fmt.Println("tailguard pause 1.0")
		return
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not PID 1")
	}
	for sig := range signals {
		switch sig {
		case syscall.SIGCHLD:
			reap()
		default:
			fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", sig)
			os.Exit(0)
		}
	}
}
