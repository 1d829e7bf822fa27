package natsutil

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// AutoReplicas as StreamConfig.Replicas (its default) asks for
// autoReplicas where the JetStream cluster can place them and takes 1 where
// it cannot: a single server (the single-machine default) has nothing to
// replicate to, and a cluster short of servers should still carry deltas.
const AutoReplicas = 0

// autoReplicas is what AutoReplicas asks for: three copies survive the
// loss of one server (a Raft quorum of two), the shipped NATS StatefulSet's
// size.
const autoReplicas = 3

// AutoReplicasFor is the count AutoReplicas asks for on the server nc is
// connected to: 1 on a server that is not clustered (its INFO names no
// cluster; JetStream clustering needs a cluster name), autoReplicas
// otherwise. Not leaning on the server's refusal: nats-server 2.9 (Debian's
// package, the README's install) refuses a new stream of 3 on a single server
// but accepts raising an existing one to 3.
func AutoReplicasFor(nc *nats.Conn) int {
	if nc != nil && nc.IsConnected() && nc.ConnectedClusterName() == "" {
		return 1
	}
	return autoReplicas
}

// ParseReplicas reads a --stream-replicas value: "auto" (AutoReplicas) or
// a count 1..5.
func ParseReplicas(s string) (int, error) {
	if strings.EqualFold(strings.TrimSpace(s), "auto") {
		return AutoReplicas, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 1 || n > 5 {
		return 0, fmt.Errorf("stream replicas %q: want auto or 1..5", s)
	}
	return n, nil
}

// FormatReplicas is ParseReplicas' inverse.
func FormatReplicas(n int) string {
	if n == AutoReplicas {
		return "auto"
	}
	return strconv.Itoa(n)
}

// JetStream's API error codes for replicas it will not place.
const (
	jsNoPeers              = 10005 // "no suitable peers for placement" (a cluster short of servers)
	jsReplicasNotSupported = 10074 // "replicas > 1 not supported in non-clustered mode"
)

// ReplicasRefused is replicasRefused for the other JetStream assets a
// sidecar owns (the tokenizer object store), which follow the stream's
// replicas rule.
func ReplicasRefused(err error) (single, cluster bool) { return replicasRefused(err) }

// replicasRefused classifies err as JetStream refusing a stream's replicas:
// single for a server that is not clustered (1 is all it will ever take),
// cluster for a cluster that cannot place them now (too few servers up, or
// without room on enough of them). Neither: err is something else.
func replicasRefused(err error) (single, cluster bool) {
	var api *jetstream.APIError
	if !errors.As(err, &api) {
		return false, false
	}
	switch api.ErrorCode {
	case jsReplicasNotSupported:
		return true, false
	case jsNoPeers, jsInsufficientResources, jsStorageResourcesExceed:
		return false, true
	}
	return false, false
}
