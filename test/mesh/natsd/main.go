//go:build chaos

// Command natsd is a NATS server with JetStream as its own process, for the
// chaos test (test/mesh/chaos_test.go), which kills it with SIGKILL and
// starts it again on the same port and store.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	port := flag.Int("port", 4222, "client port on 127.0.0.1")
	store := flag.String("store", "", "JetStream store directory")
	flag.Parse()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: *port, JetStream: true, StoreDir: *store, NoLog: true, NoSigs: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv.Start()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	srv.Shutdown()
}
